"""Command-line tools (each ``python -m lrl_lab.tools.<name>``); the library they call lives outside this folder.

- ``mismatch``: engine-style vs trainer-style log-probs of one model (also ``python -m lrl_lab.mismatch``);
- ``plot_run``: a run's TensorBoard scalars as one PNG.

The simulator's command line is ``python -m lrl_lab.sim``; the experiments are ``python -m lrl_lab.experiments.<name>``.
"""
