"""`aioworker api` and `serve`'s HTTP flags: several served names, the API key from the flag, the
environment or the config, a chat template file; and `serve` hands them to its HTTP server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aioworker.api.gateway import Gateway
from aioworker.cli.api import api_config
from aioworker.cli.main import build_parser
from aioworker.cli.serve import api_argv, worker_config_argv
from aioworker.config import ConfigError, load_config
from aioworker.wire.client import Client

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


def api_args(*argv: str):
    return build_parser().parse_args(["api", *argv])


def test_several_served_names_and_a_plain_string_still_works() -> None:
    config = api_config(api_args("--served-model-name", "first", "second"))
    assert config.api.served_model_names == ("first", "second")
    one = load_config(overrides={"api.served_model_name": "solo"})
    assert one.api.served_model_names == ("solo",)


def test_the_api_key_comes_from_the_flag_then_the_environment_then_the_config(
    monkeypatch,
) -> None:
    monkeypatch.setenv("AIOWORKER_API_KEY", "from-env")
    assert api_config(api_args("--api-key", "from-flag")).api.api_key == "from-flag"
    assert api_config(api_args()).api.api_key == "from-env"
    monkeypatch.delenv("AIOWORKER_API_KEY")
    configured = api_config(api_args("--set", "api.api_key=from-config"))
    assert configured.api.api_key == "from-config"


def test_serve_passes_the_http_flags_to_its_server(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    argv = ["serve", "--api-port", "0", "--served-model-name", "a", "b"]
    argv += ["--api-key", "k", "--chat-template", str(template)]
    serve_args = build_parser().parse_args(argv)
    child = api_argv(serve_args, worker_config_argv(serve_args))
    args = build_parser().parse_args(child[child.index("api") :])
    config = api_config(args)
    assert config.api.served_model_names == ("a", "b") and config.api.api_key == "k"
    assert config.api.chat_template == str(template)


def test_a_chat_template_file_replaces_the_models(tmp_path: Path, embedded_model_dir) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    config = load_config(overrides={"api.chat_template": str(template)})
    gateway = Gateway.from_config(config, Client.from_config(config))
    try:
        messages = [{"role": "user", "content": "Hi"}]
        token_ids = asyncio.run(gateway.tokens.encode_chat(messages))
        expected = gateway.tokenizer.encode("[user] Hi\n", add_special_tokens=False)
        assert token_ids == expected
    finally:
        gateway.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [(None, "cannot read"), ("{% for %}", "does not render")],
)
def test_a_chat_template_that_cannot_serve_fails_at_start(tmp_path: Path, text, message) -> None:
    template = tmp_path / "t.jinja"
    if text is not None:
        template.write_text(text)
    config = load_config(overrides={"api.chat_template": str(template)})
    with pytest.raises(ConfigError, match=message):
        Gateway.from_config(config, Client.from_config(config))


def test_serve_refuses_http_flags_without_an_http_server(capsys) -> None:
    from aioworker.cli.serve import run

    args = build_parser().parse_args(["serve", "--api-key", "k", "--served-model-name", "a"])
    assert run(args) != 0
    assert (
        "--served-model-name, --api-key: these configure the HTTP server" in capsys.readouterr().err
    )
