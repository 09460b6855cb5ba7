"""The largest work the simulator takes, from its command line or from a trace: beyond these no machine holds
the tensors or finishes the run, so such input is refused before anything is allocated."""

MAX_SLOTS = 2**20  # 1,048,576 slots (or episodes per step): the largest pool measured (docs/simulate.md)
MAX_EPISODES = 2**25  # steps x batch of one simulated run: about 20 s of simulation per 2**24 episodes
MAX_POOL = 2**26  # n_durations x max_turns: the duration model's largest tensor (256 MiB of float32)
MAX_SECONDS = 1e9  # 31 years: any duration, step or sync time beyond it is a typo, not a pipeline
MAX_SEED = 2**63 - 1  # torch's generators take a signed 64-bit seed
