"""Training, data and evaluation of execstate's world models (the runtime's ``execstate.model.world``
holds the models themselves, their renderers and what a session needs to run them).

- grid world (the top-down maze): ``data``, ``teacher``, ``train``, ``eval``, ``speed`` and the
  ``execstate world`` command (``cli``);
- maze world (the first-person maze): ``maze_data``, ``maze_teacher``, ``maze_rolling``,
  ``maze_train``, ``maze_quality`` (with ``maze_script``, ``maze_metrics``).

Not in the runtime's wheel: they come with the benchmarks' distribution (``benchmarks/``, which
``make setup`` installs), which registers ``execstate world`` and the trainer that ``execstate models
prepare world`` runs through entry points. E.g. ``python -m execstate_bench.world_tools.maze_train
--out runs/maze``.
"""
