"""The configuration layer: flags > AX_* environment > ax.toml > defaults."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from axengine.cli import main as ax
from axengine.config import AxConfig
from axengine.local import LocalSession
from axengine.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[1]

TOML = """\
home = "from-file"
queue = "redis://file:6379/0"
prefix = "/file"

[handlers]
egress_allowed_hosts = ["file.example.com"]
llm_api_key = "sk-file-secret"
smtp_url = "smtp://ax:hunter2@mail.example.com:587"
trust = "api"

[llm]
api_key = "sk-llm-secret"
base_url = "http://127.0.0.1:8000/v1"

[tools]
modules = ["my_tools.geo"]
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A working directory of its own and no AX_* variable of the caller's shell."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.upper().startswith("AX_"):
            monkeypatch.delenv(name)


def _write(path: Path, text: str = TOML) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_file_or_env() -> None:
    loaded = load_settings(env={})
    assert loaded.config_file is None
    config = AxConfig.from_settings(loaded.settings)
    assert config == AxConfig()
    assert all(source == "default" for _, _, source in loaded.rows())


def test_precedence_file_then_env_then_flag(tmp_path: Path) -> None:
    _write(tmp_path / "ax.toml")  # found in the working directory
    env = {"AX_QUEUE": "redis://env:6379/0", "AX_HOME": "from-env"}
    loaded = load_settings(env=env, flags={"home": "from-flag", "prefix": None})
    s = loaded.settings
    assert str(s.home) == "from-flag" and loaded.source_of("home") == "flag"
    assert s.queue == "redis://env:6379/0" and loaded.source_of("queue") == "AX_QUEUE"
    assert s.prefix == "/file" and loaded.source_of("prefix") == "ax.toml:3"
    assert s.store == "" and loaded.source_of("store") == "default"
    # The same through AxConfig.from_env, the entry point every process uses.
    config = AxConfig.from_env(env, home="from-flag")
    assert (str(config.home), config.queue_url, config.prefix) == (
        "from-flag", "redis://env:6379/0", "/file")


def test_nested_env_overrides_a_handler_setting_of_the_file(tmp_path: Path) -> None:
    _write(tmp_path / "ax.toml")
    env = {"AX_HANDLERS__EGRESS_ALLOWED_HOSTS": '["env.example.com", "*.corp"]',
           "AX_HANDLERS__HTTP_TIMEOUT": "5", "AX_LLM__MODEL": "gpt-4o"}
    loaded = load_settings(env=env)
    settings = loaded.settings.handler_settings()
    assert settings["egress_allowed_hosts"] == ["env.example.com", "*.corp"]
    assert settings["http_timeout"] == 5.0
    assert loaded.source_of("handlers.egress_allowed_hosts") == \
        "AX_HANDLERS__EGRESS_ALLOWED_HOSTS"
    # [llm] is free-form and merged key by key; [tools] becomes tool_modules.
    assert settings["llm"] == {"api_key": "sk-llm-secret",
                               "base_url": "http://127.0.0.1:8000/v1", "model": "gpt-4o"}
    assert settings["tool_modules"] == ["my_tools.geo"]
    # Secrets reach the handlers in clear: they are the handlers' configuration.
    assert settings["llm_api_key"] == "sk-file-secret"
    assert settings["smtp_url"] == "smtp://ax:hunter2@mail.example.com:587"


def test_legacy_variables_keep_working_below_the_nested_ones() -> None:
    env = {"AX_HOME": "h", "AX_STORE": "etcd://e:2379", "AX_BLOBS": "b", "AX_PREFIX": "/p",
           "AX_MAIL_DIR": "m", "AX_SMTP_URL": "smtp://legacy:25"}
    config = AxConfig.from_env(env)
    assert (config.home, config.store_url, config.blob_dir, config.prefix) == (
        Path("h"), "etcd://e:2379", Path("b"), "/p")
    assert config.handler_settings == {"mail_dir": "m", "smtp_url": "smtp://legacy:25"}
    loaded = load_settings(env={**env, "AX_HANDLERS__MAIL_DIR": "new"})
    assert loaded.settings.handlers.mail_dir == "new"
    assert loaded.source_of("handlers.smtp_url") == "AX_SMTP_URL"


def test_unknown_key_names_file_line_and_suggests(tmp_path: Path) -> None:
    path = _write(tmp_path / "ax.toml", '[handlers]\negress_alowed_hosts = ["x"]\n')
    with pytest.raises(SettingsError) as err:
        load_settings(env={})
    message = str(err.value)
    assert f"{path.name}:2" in message
    assert "unknown key handlers.egress_alowed_hosts" in message
    assert "did you mean handlers.egress_allowed_hosts?" in message

    _write(tmp_path / "ax.toml", 'hom = "x"\n')
    with pytest.raises(SettingsError, match=r"did you mean home\?"):
        load_settings(env={})


def test_bad_values_name_their_source(tmp_path: Path) -> None:
    _write(tmp_path / "ax.toml", '[handlers]\ntrust = "everyone"\n')
    with pytest.raises(SettingsError, match=r"ax.toml:2: handlers.trust"):
        load_settings(env={})
    with pytest.raises(SettingsError, match=r"AX_HANDLERS__HTTP_TIMEOUT: handlers.http_timeout"):
        load_settings(env={"AX_HANDLERS__HTTP_TIMEOUT": "soon"}, config_file=None)
    _write(tmp_path / "ax.toml", "home = \n")
    with pytest.raises(SettingsError, match=r"ax.toml: not valid TOML: .*line 1"):
        load_settings(env={})


def test_ax_config_env_and_config_flag_name_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    by_env = _write(elsewhere / "by-env.toml", 'prefix = "/by-env"\n')
    by_flag = _write(elsewhere / "by-flag.toml", 'prefix = "/by-flag"\n')
    _write(tmp_path / "ax.toml", 'prefix = "/cwd"\n')
    assert AxConfig.from_env({}).prefix == "/cwd"
    assert AxConfig.from_env({"AX_CONFIG": str(by_env)}).prefix == "/by-env"

    monkeypatch.setenv("AX_CONFIG", str(by_env))
    assert ax(["config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["config_file"] == str(by_env)
    assert shown["settings"]["prefix"] == {"value": "/by-env", "source": f"{by_env}:1"}

    assert ax(["--config", str(by_flag), "config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["settings"]["prefix"]["value"] == "/by-flag"
    # --config holds for that run only.
    assert AxConfig.from_env().prefix == "/by-env"

    assert ax(["--config", str(tmp_path / "missing.toml"), "config", "show"]) == 2
    assert "missing.toml: no such file" in capsys.readouterr().err


def test_config_show_masks_secrets_and_names_sources(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "ax.toml")
    monkeypatch.setenv("AX_STORE", "etcd://ax:s3cret@etcd:2379")
    assert ax(["config", "show", "--home", "flagged"]) == 0
    out = capsys.readouterr().out
    for secret in ("sk-file-secret", "sk-llm-secret", "hunter2", "s3cret"):
        assert secret not in out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert '"***"' in lines["handlers.llm_api_key"]
    assert "smtp://ax:***@mail.example.com:587" in lines["handlers.smtp_url"]
    assert '"***"' in lines["llm.api_key"]
    assert "etcd://ax:***@etcd:2379" in lines["store"] and "(AX_STORE)" in lines["store"]
    assert lines["home"].endswith("(flag)")
    assert lines["handlers.trust"].endswith("(ax.toml:9)")
    assert lines["handlers.input_root"].endswith("(default)")

    assert ax(["config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["settings"]
    assert shown["handlers.llm_api_key"]["value"] == "***"
    assert shown["tools.modules"] == {"value": ["my_tools.geo"], "source": "ax.toml:16"}


def test_bad_file_is_a_clean_cli_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "ax.toml", "[handler]\ntrust = 'local'\n")
    assert ax(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert "unknown key handler" in err and "did you mean handlers?" in err


def test_handler_setting_in_ax_toml_reaches_the_local_session(tmp_path: Path) -> None:
    _write(tmp_path / "ax.toml", '[handlers]\negress_allowed_hosts = ["api.example.com"]\n'
                                 '[tools]\nmodules = ["my_tools.geo"]\n')
    session = LocalSession(AxConfig.from_env(home=str(tmp_path / "home")))
    spec = session.process.shape.executor
    assert spec is not None
    assert spec.settings["egress_allowed_hosts"] == ["api.example.com"]
    assert spec.settings["tool_modules"] == ["my_tools.geo"]
    assert spec.settings["trust"] == "local"  # ax run's default, the file does not set it
    assert spec.settings["mail_dir"] == str(tmp_path / "home" / "mail")


def test_ax_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        ax(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ax {version('axengine')}"


def test_ax_run_works_from_another_directory(tmp_path: Path) -> None:
    """A DAG outside the repository, run from a directory that is not the repository."""
    dag = tmp_path / "elsewhere" / "hello.yaml"
    dag.parent.mkdir()
    dag.write_text(
        "name: hello\nnodes:\n  say:\n    type: tool_call\n    tool: echo\n",
        encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AX_")}
    proc = subprocess.run(
        [sys.executable, "-m", "axengine.cli", "run", str(dag), "--input", '{"x": 1}',
         "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "SUCCEEDED"
    assert (tmp_path / ".ax" / "ax.db").exists()


def test_worker_lane_settings_reach_the_embedded_executor(tmp_path: Path) -> None:
    (tmp_path / "ax.toml").write_text("[worker]\nfast_share = 0.25\n")
    config = AxConfig.from_env(env={"AX_CONFIG": str(tmp_path / "ax.toml"),
                                    "AX_WORKER__AGING_SECONDS": "5"}, home=tmp_path)
    assert (config.worker.fast_share, config.worker.aging_seconds) == (0.25, 5.0)

    async def started() -> tuple[float, float | None]:
        async with LocalSession(config, concurrency=8) as session:
            executor = session.process.executor
            assert executor is not None
            return executor.fast_share, executor.aging_seconds

    assert asyncio.run(started()) == (0.25, 5.0)
    with pytest.raises(SettingsError, match="fast_share"):
        AxConfig.from_env(env={"AX_WORKER__FAST_SHARE": "1.5"})
