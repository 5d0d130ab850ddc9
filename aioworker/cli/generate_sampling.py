"""`aioworker generate`'s sampling options, and the SamplingParams they make (offline and remote
alike). Bad words are given as text and tokenized here with the model's tokenizer."""

from __future__ import annotations

import argparse
import json

from aioworker.cli.generate_guided import add_guided_arguments, guided_params
from aioworker.config import WorkerConfig
from aioworker.core.sampling_params import SamplingParams, bad_words_token_ids


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    sampling = parser.add_argument_group("sampling")
    add = sampling.add_argument
    add("--max-tokens", type=int, default=128, help="tokens to generate per prompt (default 128)")
    add("--min-tokens", type=int, default=0, help="tokens before a stop token may end it")
    add("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    add("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    add("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = all")
    add("--min-p", type=float, default=0.0,
        help="drop tokens less likely than MIN_P times the likeliest one, after temperature "
        "(0-1; 0 = off)")  # fmt: skip
    add("--seed", type=int,
        help="per-request seed: same tokens whatever the batch; -1 = no seed (the "
        "default)")  # fmt: skip
    add("--ignore-eos", action="store_true", help="do not stop at the model's EOS token")
    add("--stop", action="append", default=[], metavar="TEXT",
        help="end the output where TEXT appears, without it (repeatable)")  # fmt: skip
    _add_control_arguments(sampling)
    add_guided_arguments(parser)


def _add_control_arguments(sampling: argparse._ArgumentGroup) -> None:
    add = sampling.add_argument
    add("--repetition-penalty", type=float, default=1.0, metavar="P",
        help="every token of the prompt or the output so far: a positive logit is divided by P, "
        "a negative one multiplied (P > 1 discourages repeats; 1 = off)")  # fmt: skip
    add("--presence-penalty", type=float, default=0.0, metavar="P",
        help="subtract P from the logit of every token already in the output "
        "(-2 to 2; 0 = off)")  # fmt: skip
    add("--frequency-penalty", type=float, default=0.0, metavar="P",
        help="subtract P times the number of times a token is already in the output "
        "(-2 to 2; 0 = off)")  # fmt: skip
    add("--logit-bias", metavar="JSON",
        help="add to the logits of some token ids, -100 to 100: "
        '\'{"50256": -100, "13": 5}\'')  # fmt: skip
    add("--allowed-token-ids", metavar="JSON",
        help="sample only these token ids: '[1, 2, 3]'")  # fmt: skip
    add("--bad-words", action="append", default=[], metavar="TEXT",
        help="never generate TEXT (repeatable): it is tokenized with the model's tokenizer as "
        "written and after a space, and the last token of each is banned wherever the output "
        "ends with the others")  # fmt: skip


def sampling_params(args: argparse.Namespace, config: WorkerConfig) -> SamplingParams:
    """Raises ValueError (InvalidRequestError included) naming the option to fix."""
    params = SamplingParams(
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=None if args.seed == -1 else args.seed,
        ignore_eos=args.ignore_eos,
        stop=tuple(args.stop),
        logprobs=args.logprobs,
        prompt_logprobs=args.prompt_logprobs,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        logit_bias=_logit_bias(args.logit_bias),
        allowed_token_ids=_allowed_token_ids(args.allowed_token_ids),
        bad_words_token_ids=_bad_words(args.bad_words, config),
        guided=guided_params(args),
    )
    params.validate()  # before the model loads, so a typo fails fast
    return params


def _json(option: str, text: str, example: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{option} is not valid JSON ({exc}); give something like {example}"
        ) from exc


def _logit_bias(text: str | None) -> dict[int, float]:
    if text is None:
        return {}
    example = "'{\"50256\": -100}'"
    parsed = _json("--logit-bias", text, example)
    try:
        if not isinstance(parsed, dict):
            raise TypeError
        return {int(token): float(bias) for token, bias in parsed.items()}
    except (TypeError, ValueError):
        raise ValueError(
            f"--logit-bias must map token ids to numbers, like {example}; got {text}"
        ) from None


def _allowed_token_ids(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    parsed = _json("--allowed-token-ids", text, "'[1, 2, 3]'")
    if not (isinstance(parsed, list) and all(type(t) is int for t in parsed)):
        raise ValueError(
            f"--allowed-token-ids must be a list of token ids, like [1, 2, 3]; got {text}"
        )
    return tuple(parsed)


def _bad_words(words: list[str], config: WorkerConfig) -> tuple[tuple[int, ...], ...]:
    if not words:
        return ()
    from aioworker.cli.generate_remote import load_tokenizer

    tokenizer = load_tokenizer(config)
    if tokenizer is None:
        raise ValueError(
            "--bad-words needs the model's tokenizer.json; give --model a directory that has one"
        )
    return bad_words_token_ids(lambda text: tokenizer.encode(text, add_special_tokens=False), words)
