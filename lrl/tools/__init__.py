"""Command-line tools (each ``python -m lrl.tools.<name>``); the library they call lives outside this folder.

- ``mismatch``: engine-style vs trainer-style log-probs of one model (also ``python -m lrl.mismatch``);
- ``plot_run``: a run's TensorBoard scalars as one PNG.

The simulator's command line is ``python -m lrl.sim``; the experiments are ``python -m lrl.experiments.<name>``.
"""
