import random

import pytest

from lrl.envs.tinyagent import N_LINES, BugFixEnv, build_tokenizer, make_tasks, random_task
from lrl.envs.tinyagent.tasks import SUSPECT_OPS


def test_splits_are_fixed_and_disjoint():
    train, held, all_ = make_tasks("train"), make_tasks("heldout"), make_tasks("all")
    assert (len(train), len(held), len(all_)) == (20, 10, 30)
    assert [t.task_id for t in all_] == list(range(30))
    assert make_tasks("all") == all_  # deterministic
    assert not {t.lines for t in train} & {t.lines for t in held}
    with pytest.raises(ValueError, match="split"):
        make_tasks("test")


def test_each_task_has_exactly_one_suspect_line_and_five_candidates():
    for task in make_tasks("all"):
        suspect = [i + 1 for i, line in enumerate(task.lines) if line.split()[0] in SUSPECT_OPS]
        assert suspect == [task.answer]
        assert task.candidates == tuple(range(1, N_LINES + 1))
        assert str(task.answer) not in task.prompt.split("candidates")[0]  # the prompt does not leak it


def test_blind_guess_passes_a_fifth(tok):
    rng = random.Random(0)
    tasks, wins, n = make_tasks("train"), 0, 5000
    env = BugFixEnv(tok)
    for k in range(n):
        env.reset(tasks[k % len(tasks)])
        guess = rng.randint(1, N_LINES)
        wins += env.step([tok.id("answer"), tok.id(str(guess)), tok.eos_id]).reward
    assert abs(wins / n - 0.2) < 0.02  # 3.5 standard errors at n=5000


def test_reading_reveals_the_bug_line(tok):
    env = BugFixEnv(tok)
    for task in make_tasks("all"):
        env.reset(task)
        result = env.step([tok.id("read"), tok.eos_id])
        assert not result.done and result.reward == 0
        words = tok.decode(result.observation).split(" ; ")
        buggy = [w for w in words if w.split()[1] in SUSPECT_OPS]
        assert len(buggy) == 1 and buggy[0].split()[0] == str(task.answer)
        assert env.step([tok.id("answer"), tok.id(str(task.answer)), tok.eos_id]).reward == 1.0


@pytest.mark.parametrize(
    "action",
    [["read", "read"], ["answer", "read", "<eos>"], ["answer", "9"], ["<eos>"], ["answer", "3"], ["read"]],
)
def test_malformed_actions_end_invalid(tok, action):
    env = BugFixEnv(tok)
    env.reset(make_tasks("train")[0])
    ids = [tok.id(w) if w in tok.index else tok.id("answer") for w in action]
    result = env.step(ids)
    assert result.done and result.reward == 0 and result.info["invalid"]


def test_turn_limit_ends_runaway_episodes(tok):
    env = BugFixEnv(tok, max_turns=3)
    env.reset(make_tasks("train")[0])
    results = [env.step([tok.id("read"), tok.eos_id]) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] and results[-1].reward == 0
    with pytest.raises(RuntimeError):
        env.step([tok.id("read"), tok.eos_id])


def test_tokenizer_round_trip_and_specials(tok):
    for task in make_tasks("all"):
        for text in (task.prompt, task.source):
            assert tok.decode(tok.encode(text)) == text
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    assert tok.decode([tok.pad_id, tok.id("read"), tok.pad_id]) == "read"
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("segfault")


def test_tokenizer_save_load(tmp_path, tok):
    tok.save(tmp_path)
    from lrl.tokenizers import WordTokenizer

    assert WordTokenizer.load(tmp_path).vocab == tok.vocab


def test_generated_demonstration_tasks_cover_the_vocabulary(tok):
    rng = random.Random(5)
    for _ in range(200):
        t = random_task(rng)
        tok.encode(t.prompt + " " + t.source)
    assert build_tokenizer().vocab == tok.vocab  # the tasks add no word outside the fixed vocabulary
