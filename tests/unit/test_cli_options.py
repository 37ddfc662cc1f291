"""Options generated from one model: `rollout gateway`'s options are `GatewaySettings`'
fields, and the Temporal connection group is the same on every command that reaches
Temporal. The oracle is the command line typer builds (its own introspection), not the
generator."""

from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from pydantic.fields import FieldInfo
from typer.testing import CliRunner

from gateway.options import CoreSettings, GatewayOptions, OptionSpec
from rollout_client.temporal_connection import TemporalTLS
from workers.cli import app
from workers.gateway_settings import GatewaySettings
from workers.model_options import model_options
from workers.temporal_options import TemporalOptions, tls_environment

SET_BY_PROGRAM = {
    "advertised_url",
    "parse_offload_bytes",
    "request_timeout_s",
    "peer_control_urls",
    "tokenize_workers",
    "control_own_loop",
}
"""`GatewaySettings` fields the program sets (the supervisor, an in-process caller)."""


def command_params(name: str) -> dict[str, Any]:
    """The command's options as typer built them: field name → click parameter."""
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.name != "help"}


def spec_of(info: FieldInfo) -> OptionSpec | None:
    return next((m for m in info.metadata if isinstance(m, OptionSpec)), None)


def test_the_gateway_options_are_the_settings_fields_with_their_help_and_defaults() -> None:
    params = command_params("gateway")
    fields = GatewaySettings.model_fields
    assert set(params) == set(fields) - SET_BY_PROGRAM
    for name, param in params.items():
        info = fields[name]
        spec = spec_of(info)
        flag = spec.name if spec and spec.name else "--" + name.replace("_", "-")
        assert param.opts == [flag], name
        assert param.help == info.description, name
        assert param.required == info.is_required(), name
        if info.default_factory is None and not info.is_required():
            assert param.default == info.default, name
    assert params["admin_token"].envvar == "ROLLOUT_ADMIN_TOKEN"
    assert params["insecure_dev"].secondary_opts == ["--no-insecure-dev"]


def test_the_core_settings_are_declared_once_for_the_command_line_and_the_core() -> None:
    for model in (GatewaySettings, GatewayOptions):
        assert issubclass(model, CoreSettings)
        assert not set(CoreSettings.model_fields) & set(vars(model)["__annotations__"]), model


def settings_command(built: list[GatewaySettings]) -> typer.Typer:
    """A one-command CLI whose options are generated from the gateway settings; each run
    appends the settings it built to `built`."""
    command = typer.Typer()

    @command.command()
    @model_options("settings")
    def serve(*, settings: GatewaySettings) -> None:
        built.append(settings)

    return command


def test_the_command_line_builds_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[GatewaySettings] = []
    command = settings_command(built)

    monkeypatch.setenv("ROLLOUT_ADMIN_TOKEN", "from-env")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    args = ["--engine", "http://a:1, http://b:2,", "--model", "m", "--tokenizer", "tok"]
    args += ["--engine-routing", "round-robin", "--checkpoint-root", "ckpt", "--fsync", "off"]
    result = CliRunner().invoke(command, [*args, "--processes", "2", "--no-insecure-dev"])
    assert result.exit_code == 0, result.output
    assert built == [
        GatewaySettings(
            engine_urls=["http://a:1", "http://b:2"],
            model="m",
            tokenizer=Path("tok"),
            engine_routing="round_robin",
            checkpoint_roots=[tmp_path.resolve() / "ckpt"],
            fsync="off",
            processes=2,
            admin_token="from-env",
        )
    ]


def test_a_value_the_settings_refuse_is_a_usage_error_naming_the_option() -> None:
    command = typer.Typer()

    @command.command()
    @model_options("settings")
    def serve(*, settings: GatewaySettings) -> None:
        raise AssertionError("settings the model refuses were built")

    runner = CliRunner()
    base = ["--model", "m", "--tokenizer", "tok"]
    no_engine = runner.invoke(command, [*base, "--engine", " , "])
    assert no_engine.exit_code == 2
    assert "--engine: List should have at least 1 item" in no_engine.output
    accepted = runner.invoke(command, [*base, "--engine", "http://a", "--port", "65535"])
    refused = runner.invoke(command, [*base, "--engine", "http://a", "--port", "65536"])
    assert (accepted.exit_code, refused.exit_code) == (1, 2)  # 1: the command ran (it raised)
    assert "--port" in refused.output and "65535" in refused.output


def test_every_command_that_reaches_temporal_has_the_one_group() -> None:
    group = {name: info.description for name, info in TemporalOptions.model_fields.items()}
    for command in ("run", "worker", "train"):
        params = command_params(command)
        assert {name: params[name].help for name in group} == group, command
    demo = command_params("demo")  # the same group, but its default is a dev server of its own
    assert {name: demo[name].help for name in group if name != "temporal"} == {
        name: help for name, help in group.items() if name != "temporal"
    }
    assert demo["temporal"].default is None and "dev server" in (demo["temporal"].help or "")
    assert command_params("worker")["temporal_tls"].secondary_opts == []  # a flag: --temporal-tls


def test_the_trainer_process_gets_the_commands_tls_settings(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "c.key"):
        (tmp_path / name).write_text("pem")
    tls = TemporalOptions(
        temporal_tls_ca=tmp_path / "ca.pem",
        temporal_tls_cert=tmp_path / "c.pem",
        temporal_tls_key=tmp_path / "c.key",
        temporal_tls_server_name="temporal.internal",
        temporal_api_key="k",
    ).tls()
    env = tls_environment(tls)
    assert TemporalTLS.from_env(env) == tls
    assert tls_environment(TemporalTLS()) == {}


SHAPE = ["--routed-experts-layers", "4", "--routed-experts-top-k", "2"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--routed-experts"], "--routed-experts: vLLM's /v1/completions returns no routed"),
        (
            ["--routed-experts", "--engine-api", "sglang"],
            "--routed-experts: SGLang returns routed experts without their shape",
        ),
        (
            ["--routed-experts-layers", "4"],
            "give --routed-experts-layers and --routed-experts-top-k",
        ),
    ],
)
def test_routed_experts_on_an_engine_api_that_cannot_return_them_is_refused_at_start(
    args: list[str], says: str
) -> None:
    built: list[GatewaySettings] = []
    command = settings_command(built)

    runner = CliRunner()
    base = ["--model", "m", "--tokenizer", "tok", "--engine", "http://a"]
    refused = runner.invoke(command, [*base, *args])
    text = " ".join(refused.output.replace("│", " ").split())  # rich's box, unwrapped
    assert refused.exit_code == 2 and says in text, text
    # control: the engine APIs that return them start
    for ok in (
        ["--routed-experts", "--engine-api", "generate"],
        ["--routed-experts", "--engine-api", "sglang", *SHAPE],
    ):
        assert runner.invoke(command, [*base, *ok]).exit_code == 0
    assert [s.routing_shape for s in built] == [None, (4, 2)]
