"""``python -m lrl.mismatch``: the former name of ``python -m lrl_lab.mismatch``, in the lab (lrl/former_names.py)."""

if __name__ == "__main__":
    from lrl.former_names import forward

    forward("lrl.mismatch", "lrl_lab.mismatch")
