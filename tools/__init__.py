"""Tools that work on execstate but are not part of its runtime package (not in the wheel): the world
models' training, data and evaluation (``tools/world``)."""
