"""What the tests share across their directories and nothing else uses (the tests import it as
``support``: pytest's ``pythonpath`` holds ``tests/``). Test support that a benchmark uses too (the
fault-injecting importer, the desync harness, the Redis server launcher, the world numerics
comparison) lives in the benchmarks' distribution (``benchmarks/execstate_bench``), which the tests
import: a benchmark never imports ``tests/``, and the runtime imports neither."""
