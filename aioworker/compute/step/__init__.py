"""The step pipeline: one launch template (`runner.py`) that every runner follows, the CUDA
runner's overrides (`cuda_runner.py`), and the decode graphs it replays (`cuda_graphs.py`)."""
