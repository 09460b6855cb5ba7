"""A chat model's episodes are its chat template's rendering of the conversation, token for token: three-turn
episodes of every environment against ``apply_chat_template`` of the whole conversation, for SmolLM2's ChatML
template (its default system prompt inserted whenever the messages have none, its bos the start marker) and for
a Qwen-style template with a ``tool`` role; the system message; templates refused up front."""

from __future__ import annotations

import pytest
from conftest import quick_cfg

from lrl.envs import make_env
from lrl.tokenizers import ChatTemplateError, HFTokenizer, load_tokenizer

# A Qwen-style ChatML template with a tool role: tool results are a user turn holding <tool_response> blocks
QWEN_STYLE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}"
    "{%- elif m['role'] == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SMOLLM_DEFAULT = "You are a helpful AI assistant named SmolLM"


class Recording(HFTokenizer):
    """The chat tokenizer, noting the texts the environment frames (prompt and observations)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.texts: list[tuple[str, str]] = []

    def conversation(self, system, observation_role="user"):
        return Recording(self.hf, system, observation_role)

    def prompt(self, text):
        self.texts.append(("prompt", text))
        return super().prompt(text)

    def observation(self, text):
        self.texts.append(("observation", text))
        return super().observation(text)


def smollm2_tokenizer(path) -> HFTokenizer:
    return Recording(load_tokenizer(path).hf)


def qwen_style_tokenizer(path) -> HFTokenizer:
    hf = load_tokenizer(path).hf
    hf = hf.__class__.from_pretrained(path)
    hf.chat_template = QWEN_STYLE
    return Recording(hf)


# the three turns of an episode of each environment: two that continue, one that ends it
ACTIONS = {
    "tinyagent": ["read", "read", "answer 2"],
    "codefix": ["test 1", "test 2", "submit 1"],
    "review": None,  # the page's verdicts, built from the task
}


def review_actions(task) -> list[str]:
    return [" ".join(f"{i} ok" for i in range(1, len(task.page_lines(p)) + 1)) for p in range(task.n_pages)]


def play(env_name, tok, role="user", system=None):
    """A three-turn episode -> (its tokens, the conversation as messages, the tokenizer the env used)."""
    extra = {"env_workers": 1} if env_name == "codefix" else {}
    cfg = quick_cfg(env=env_name, observation_role=role, system_prompt=system, max_turns=5, **extra)
    spec = make_env(cfg, tok)
    tasks = [t for t in spec.train_tasks if env_name != "review" or t.n_pages >= 3]
    task = min(tasks, key=lambda t: t.n_pages) if env_name == "review" else tasks[0]  # three pages, or more
    env = spec.make()
    used = spec.tok
    tokens = list(env.reset(task))
    texts = ACTIONS[env_name] or review_actions(task)
    messages = [{"role": "system", "content": used.system}] if used.system else []
    messages.append({"role": "user", "content": task.prompt})
    for i, text in enumerate(texts):
        action = used.encode(text) + [used.eos_id]
        result = env.step(action)
        tokens += action + list(result.observation)
        messages.append({"role": "assistant", "content": text})
        assert result.done == (i == len(texts) - 1), (env_name, i, result.info)
        if not result.done:
            kind, shown = used.texts[-1]
            assert kind == "observation"
            messages.append({"role": role, "content": shown})
    return tokens, messages, used


def rendered(tok, messages) -> list[int]:
    out = tok.hf.apply_chat_template(messages, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module", params=["smollm2", "qwen-style"])
def chat_tok(request, smollm2_cut):
    return (smollm2_tokenizer if request.param == "smollm2" else qwen_style_tokenizer)(smollm2_cut)


@pytest.mark.parametrize("env_name", ["tinyagent", "codefix", "review"])
def test_three_turn_episodes_are_the_templates_rendering_of_the_conversation(chat_tok, env_name):
    role = "tool" if chat_tok.hf.chat_template == QWEN_STYLE else "user"
    tokens, messages, used = play(env_name, chat_tok, role)
    whole = rendered(used, messages)
    assert tokens == whole[: len(tokens)]
    # the one difference, by design: the template's text after the last action's end-of-turn token
    assert used.decode(whole[len(tokens) :], skip_special=False) == "\n"
    text = used.decode(tokens, skip_special=False)
    assert text.count("<|im_start|>system") == 1 and SMOLLM_DEFAULT not in text
    assert text.startswith("<|im_start|>system\n" + used.system + "<|im_end|>")
    if role == "tool":
        assert "<tool_response>" in text


def test_the_system_message_is_the_environments_unless_the_user_gives_one(smollm2_cut):
    from lrl.envs.tinyagent import INSTRUCTIONS

    tok = smollm2_tokenizer(smollm2_cut)
    _, messages, used = play("tinyagent", tok)
    assert used.system == INSTRUCTIONS and messages[0]["content"] == INSTRUCTIONS
    tokens, _, used = play("tinyagent", tok, system="Fix it. Reply read or answer K.")
    assert used.decode(tokens, skip_special=False).startswith(
        "<|im_start|>system\nFix it. Reply read or answer K."
    )


def test_the_system_prompt_flag_reaches_the_first_message_of_a_run(smollm2_cut, tmp_path):
    from lrl.arguments import parse_args
    from lrl.run import run_tokenizer

    cfg = parse_args(["--model", str(smollm2_cut), "--system-prompt", "Be brief.", "--max-steps", "1"])
    spec = make_env(cfg, run_tokenizer(cfg.policy))
    prompt = spec.tok.decode(spec.tok.prompt("issue : x"), skip_special=False)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and SMOLLM_DEFAULT not in prompt
    yaml = tmp_path / "c.yaml"
    yaml.write_text(f"model: {smollm2_cut}\nsystem_prompt: From the file.\n")
    loaded = parse_args(["--config", str(yaml)])
    spec = make_env(loaded, run_tokenizer(loaded.policy))
    assert spec.tok.decode(spec.tok.prompt("x"), skip_special=False).startswith(
        "<|im_start|>system\nFrom the file."
    )


@pytest.mark.parametrize(
    "template, needle",
    [
        (  # roles must alternate user/assistant: an observation of role "tool" is refused by the template
            "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('roles must be system, user or assistant') }}{% endif %}"
            "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "cannot render a conversation of roles",
        ),
        (  # no generation prompt at all
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
            "adds no generation prompt",
        ),
        (  # drops the system message
            "{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
            "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "drops the system message",
        ),
    ],
    ids=["refuses-the-role", "no-generation-prompt", "drops-the-system-message"],
)
def test_a_template_that_cannot_render_an_episode_is_refused_before_any_episode(
    smollm2_cut, tmp_path, template, needle
):
    import shutil

    from helpers import train
    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(smollm2_cut, folder)
    hf = AutoTokenizer.from_pretrained(folder)
    hf.chat_template = template
    hf.save_pretrained(folder)
    done = train(
        "--model", str(folder), "--observation-role", "tool", "--max-steps", "1", "--log-dir", str(tmp_path)
    )
    assert done.returncode == 2, done.stderr[-1500:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: model: ") and needle in lines[0]
    assert str(folder) in lines[0]


def test_a_template_that_closes_turns_with_another_token_ends_actions_on_it(smollm2_cut):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_cut)
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = HFTokenizer(hf)
    assert tok.hf.convert_ids_to_tokens(tok.eos_id) == "<|endoftext|>" != hf.eos_token
    hf.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    with pytest.raises(ChatTemplateError, match="ends an assistant turn with"):
        HFTokenizer(hf)
