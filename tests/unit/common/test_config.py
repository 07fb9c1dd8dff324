"""The config dataclass is the single source of CLI flags, TOML keys and Flower run_config keys."""

import dataclasses
import tomllib
import tracemalloc

import pytest

from common.config import ConfigError
from common.methods import ExperimentConfig
from simulations.cli import build_parser, resolve_config
from tests.helpers import ROOT


@pytest.mark.parametrize(
    "change, field_name",
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"dataset": "cifar"}, "dataset"),
        ({"partition": "random"}, "partition"),
        ({"model": "huge"}, "model"),
        ({"clip": 0.0}, "clip"),
        ({"delta": 1.0}, "delta"),
        ({"clients_per_step": 30}, "clients_per_step"),
        ({"batch_size": 500}, "batch_size"),
        ({"lr_g": float("nan")}, "lr_g"),
        ({"wire_dtype": "int8"}, "wire_dtype"),
        ({"wire_samples": "uint4"}, "wire_samples"),
        ({"wire_compression": "gzip"}, "wire_compression"),
        ({"critic_fakes": "stale"}, "critic_fakes"),
        ({"replay_batches": 0}, "replay_batches"),
    ],
)
def test_invalid_values_name_field_and_value(change, field_name):
    with pytest.raises(ConfigError) as err:
        ExperimentConfig(**change)
    assert field_name in str(err.value)
    assert repr(next(iter(change.values())))[:6] in str(err.value)


def test_validating_a_configuration_costs_nothing_per_client():
    """Every node validates the run's configuration; without a client_subset, checking the subset's
    ids listed all K of them (40 MB at K = 10^6, 7 ms a message at K = 10^5)."""
    values = ExperimentConfig(num_clients=1_000_000).to_dict()
    tracemalloc.start()
    try:
        ExperimentConfig.from_mapping(values)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
    with pytest.raises(ConfigError, match="client_subset"):  # a subset is still checked
        ExperimentConfig(num_clients=10, client_subset="3,12")


def test_run_config_round_trip():
    cfg = ExperimentConfig(num_clients=5, steps=7, noise_multiplier=0.5)
    rc = cfg.to_run_config()
    assert "noise-multiplier" in rc
    assert ExperimentConfig.from_run_config(rc) == cfg


def test_unknown_and_mistyped_keys_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'sigma'"):
        ExperimentConfig.from_mapping({"sigma": 1.0})
    with pytest.raises(ConfigError, match="steps must be int"):
        ExperimentConfig.from_mapping({"steps": "ten"})
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        ExperimentConfig.from_toml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        ExperimentConfig.from_toml(tmp_path / "missing.toml")


def test_every_field_is_a_flag_with_help():
    parser = build_parser()
    sim = parser._subparsers._group_actions[0].choices["simulate"]
    flags = {opt for action in sim._actions for opt in action.option_strings}
    for f in dataclasses.fields(ExperimentConfig):
        assert "--" + f.name.replace("_", "-") in flags
        assert len(f.metadata["help"]) > 10
    for stable in (
        "--config",
        "--strategy",
        "--dataset",
        "--data-dir",
        "--partition",
        "--num-clients",
        "--steps",
        "--batch-size",
        "--noise-multiplier",
        "--clip",
        "--delta",
        "--model",
        "--seed",
        "--out",
        "--resume",
        "--no-eval",
    ):
        assert stable in flags


def test_precedence_defaults_toml_flags(tmp_path):
    toml = tmp_path / "exp.toml"
    toml.write_text("steps = 11\nbatch-size = 16\n")
    args = build_parser().parse_args(["simulate", "--config", str(toml), "--steps", "12"])
    cfg = resolve_config(args)
    assert (cfg.steps, cfg.batch_size, cfg.num_clients) == (12, 16, ExperimentConfig().num_clients)


def test_pyproject_flower_config_matches_dataclass_defaults():
    """`flwr run .` reads [tool.flwr.app.config]: it must hold every field with its default
    (regenerate with `python -m simulations.devtools.flwr_config`)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    flower = data["tool"]["flwr"]["app"]["config"]
    assert ExperimentConfig.from_run_config(flower) == ExperimentConfig()
    assert set(flower) == set(ExperimentConfig().to_run_config())


def test_shipped_experiment_files_are_valid():
    files = sorted((ROOT / "simulations" / "configs").glob("*.toml"))
    assert files
    for path in files:
        ExperimentConfig.from_toml(path)


def test_make_run_is_the_quickstart_file_gswgan_seeded_through_secure_sums_at_a_total_epsilon_of_at_most_10():
    assert "--config simulations/configs/quickstart.toml" in (ROOT / "Makefile").read_text()
    cfg = ExperimentConfig.from_toml(ROOT / "simulations" / "configs" / "quickstart.toml")
    # issue 42: the mission's method, seeded, at an honest total epsilon; never again 50 with local noise
    assert cfg.strategy == "gswgan" and cfg.init_release == "dp-merf" and cfg.secure_aggregation
    assert 0 < cfg.init_epsilon < cfg.target_epsilon <= 10 and cfg.delta == 1e-5
    assert cfg.partition == "writer" and cfg.num_clients >= 1000
    gswgan = ExperimentConfig.from_toml(ROOT / "simulations" / "configs" / "quickstart-gswgan.toml")
    # GS-WGAN's best unseeded configuration keeps ε 100, where it was measured: even there it does not
    # learn class structure (docs/getting-started.md)
    assert gswgan.strategy == "gswgan" and gswgan.target_epsilon == 100 >= cfg.target_epsilon


@pytest.mark.parametrize(
    "name", ["noise_multiplier", "dpgan_noise_multiplier", "fedavg_noise_multiplier", "merf_noise_multiplier"]
)
def test_a_noise_multiplier_too_large_for_the_accountant_is_refused(name):
    """Issue 23, item 19: 1e308 passed validation, then the accountant overflowed after the releases."""
    with pytest.raises(ConfigError, match=f"invalid {name}=1e\\+308: must be at most 1e\\+06"):
        ExperimentConfig(**{name: 1e308})
    assert getattr(ExperimentConfig(**{name: 1e6}), name) == 1e6


def test_target_epsilon_with_a_noise_multiplier_is_refused_naming_both(tmp_path, capsys):
    """Item 19: --target-epsilon silently replaced an explicit --noise-multiplier. Refused on the
    command line, in a TOML file, and across the two; config.json and Flower's run_config hold
    every key, so there (as the help says) the target wins."""
    from common.methods import calibrate
    from simulations.cli import main

    assert main(["simulate", "--target-epsilon", "10", "--noise-multiplier", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "target_epsilon=10.0 (command line) and noise_multiplier=2.0 (command line) are both given" in err
    toml = tmp_path / "exp.toml"
    toml.write_text("target-epsilon = 10\nfedavg-noise-multiplier = 0.5\n")
    with pytest.raises(ConfigError, match=rf"fedavg_noise_multiplier=0.5 \({toml}\)"):
        ExperimentConfig.from_toml(toml)
    toml.write_text("merf-noise-multiplier = 0.5\n")
    args = build_parser().parse_args(["simulate", "--config", str(toml), "--target-epsilon", "5"])
    with pytest.raises(ConfigError, match=r"target_epsilon=5.0 \(command line\) and merf_noise_multiplier=0.5"):
        resolve_config(args)
    toml.write_text("target-epsilon = 0\nnoise-multiplier = 0.5\n")  # no target: the noise stands
    assert ExperimentConfig.from_toml(toml).noise_multiplier == 0.5
    run_config = ExperimentConfig(target_epsilon=10.0, noise_multiplier=2.0, steps=10, num_clients=5).to_run_config()
    assert calibrate(ExperimentConfig.from_run_config(run_config)).noise_multiplier != 2.0
