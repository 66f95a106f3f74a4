"""The first-person maze world: a procedural 3-D maze (``layout``), its textures and themes
(``textures``), the walker's pose and physics (``pose``) and the raycaster that renders it
(``raycast``: the teacher of the maze world model and the oracle its frames are measured against)."""
