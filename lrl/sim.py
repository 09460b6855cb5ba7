"""``python -m lrl.sim``: the former name of ``python -m lrl_lab.sim``, in the lab (lrl/former_names.py)."""

if __name__ == "__main__":
    from lrl.former_names import forward

    forward("lrl.sim", "lrl_lab.sim")
