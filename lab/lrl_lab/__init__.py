"""lrl's lab, a distribution of its own beside the library (``pip install ./lab``): the rollout-pipeline simulator
(:mod:`lrl_lab.sim`), the experiments behind the result tables (:mod:`lrl_lab.experiments`) and the measuring tools
(:mod:`lrl_lab.tools`). It uses the library; the library never imports it (tests/tools/test_structure.py)."""
