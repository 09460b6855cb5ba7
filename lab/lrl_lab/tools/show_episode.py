"""Show what a model sees and says: episodes of an environment decoded token for token, special tokens shown.

    python -m lrl_lab.tools.show_episode --model smollm2-135m --env tinyagent --episodes 2
    python -m lrl_lab.tools.show_episode --model smollm2-135m --env codefix --system-prompt "Reply test K or submit K."

Each episode is sampled with the model's KV-cache decode in fp32 at --temperature, exactly as a run would frame
it (the model's chat template, the environment's instructions as the system message); the model's own tokens
are shown between [[ and ]].
"""

from __future__ import annotations

import argparse
import sys

import torch

from lrl.cli import OneLineParser


def render(tok, episode) -> str:
    """The episode's tokens as text, special tokens shown, the generated tokens between [[ and ]]."""
    out, inside = [], False
    for token, generated in zip(episode.ids, episode.generated):
        if generated and not inside:
            out.append("[[")
        if not generated and inside:
            out.append("]]")
        inside = generated
        out.append(tok.decode([token], skip_special=False))
    return "".join(out) + ("]]" if inside else "")


@torch.no_grad()
def scripted(model, spec, task, first: str, generator, sampling) -> str:
    """One episode whose first action is `first` (between {{ }}), the model's actions after it (between [[ ]])."""
    from lrl.decoding import sample_tokens

    tok, env = spec.tok, spec.make()
    ids = list(env.reset(task))
    text = tok.decode(ids, skip_special=False)
    action = tok.encode(first) + [tok.eos_id]
    result = env.step(action)
    ids += action + list(result.observation)
    text += (
        "{{"
        + tok.decode(action, skip_special=False)
        + "}}"
        + tok.decode(result.observation, skip_special=False)
    )
    turns = 1
    while not result.done:
        produced = []
        for _ in range(spec.max_action_tokens):
            logits = model(input_ids=torch.tensor([ids + produced])).logits[:, -1]
            token, _ = sample_tokens(sampling.log_probs(logits), generator)
            produced.append(int(token))
            if produced[-1] == tok.eos_id:
                break
        result = env.step(produced)
        turns += 1
        text += "[[" + tok.decode(produced, skip_special=False) + "]]"
        text += tok.decode(result.observation, skip_special=False)
        ids += produced + list(result.observation)
    return f"--- task {task.task_id}: {turns} actions, reward {result.reward}, invalid {result.info.get('invalid')}\n{text}"


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of 1 or more (0 would show nothing, and -1 every task but one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lrl_lab.tools.show_episode", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a save_pretrained folder or a named model (smollm2-135m)")
    p.add_argument("--env", default="tinyagent")
    p.add_argument("--episodes", type=at_least_one, default=1)
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--observation-role", default="user")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout", action="store_true", help="the held-out tasks (default: the train tasks)")
    p.add_argument(
        "--min-turns", type=at_least_one, default=1, help="show only episodes of at least this many actions"
    )
    p.add_argument(
        "--first-action",
        default=None,
        help="play this text as the first action (shown between {{ and }}), the model's own turns after it",
    )
    args = p.parse_args(argv)
    from lrl.config import Config, ConfigError
    from lrl.decoding import Sampling
    from lrl.envs import make_env, run_tokenizer
    from lrl.kvcache import KVCacheDecoder
    from lrl.policy import load_policy
    from lrl.preflight import check_model_folder, resolve
    from lrl.rollout import run_episodes

    try:
        cfg = Config(
            model=args.model,
            env=args.env,
            system_prompt=args.system_prompt,
            observation_role=args.observation_role,
            temperature=args.temperature,
            seed=args.seed,  # checked as a run's seed is
        )
        resolve(cfg)  # a named model -> its cached folder (converted the first time)
        problems = check_model_folder(cfg.model)  # before its tokenizer is looked for in it
        if problems:
            raise ConfigError("; ".join(problems))
        spec = make_env(cfg, run_tokenizer(cfg.policy))
        model, _ = load_policy(cfg.model, spec.tok)
    except (ConfigError, ValueError) as err:
        print(f"lrl_lab.tools.show_episode: error: {err}", file=sys.stderr)
        return 2
    tasks = list(spec.heldout_tasks if args.heldout else spec.train_tasks)[: args.episodes]
    generator = torch.Generator().manual_seed(args.seed)
    if args.first_action is not None:
        for task in tasks:
            print(
                scripted(model.eval(), spec, task, args.first_action, generator, Sampling(args.temperature))
            )
        return 0
    with torch.no_grad():
        episodes = run_episodes(
            KVCacheDecoder(model.eval(), spec.tok.pad_id), spec, tasks, generator, Sampling(args.temperature)
        )
    episodes = [e for e in episodes if len(e.actions) >= args.min_turns]
    print(f"{len(episodes)} of {len(tasks)} episodes with at least {args.min_turns} actions")
    for i, episode in enumerate(episodes):
        print(
            f"--- episode {i} (task {episode.task.task_id}): reward {episode.reward}, invalid {episode.invalid}"
        )
        print(render(spec.tok, episode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
