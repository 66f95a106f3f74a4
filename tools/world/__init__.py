"""Training, data and evaluation of execstate's world models (the runtime's ``execstate.model.world``
holds the models themselves, their renderers and what a session needs to run them).

- grid world (the top-down maze): ``data``, ``teacher``, ``train``, ``eval``, ``speed`` and the
  ``execstate world`` command (``cli``);
- maze world (the first-person maze): ``maze_data``, ``maze_teacher``, ``maze_rolling``,
  ``maze_train``, ``maze_quality`` (with ``maze_script``, ``maze_metrics``).

Run from a source checkout: ``python -m tools.world.maze_train --out runs/maze``.
"""
