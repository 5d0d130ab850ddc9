from __future__ import annotations

import pytest

from aioworker.config import ConfigError, load_config


def test_defaults_and_overrides(tmp_path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('[cache]\nblock_size = 32\n[model]\npath = "/m"\n')
    cfg = load_config(path, {"scheduler.max_num_seqs": 4, "model.seed": None})
    assert cfg.cache.block_size == 32 and cfg.model.path == "/m"
    assert cfg.scheduler.max_num_seqs == 4 and cfg.model.seed == 0


def test_shipped_default_config_loads() -> None:
    assert load_config("configs/default.toml").model.path == "embedded"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[cache]\nblok_size = 3\n", "blok_size"),
        ("[cache]\nblock_size = 'big'\n", r"\$.cache.block_size"),
        ("[cache]\nblock_size = 0\n", "cache.block_size is 0"),
        ("[cache]\ngpu_memory_utilization = 1.5\n", "gpu_memory_utilization is 1.5"),
        ("[model]\ndtype = 'int3'\n", r"\$.model.dtype"),
        ("[device]\ndecode_attention_warps = 6\n", r"\$.device.decode_attention_warps"),
        ("[device]\ndecode_attention_tile = 96\n", r"\$.device.decode_attention_tile"),
        ("[device]\npdl_max_batch = 0\n", "device.pdl_max_batch is 0"),
        ("[device]\ndecode_attention_stages = 9\n", "device.decode_attention_stages is 9"),
        ("not toml ===", "not valid TOML"),
        (
            "[device]\nsmall_batch_kernels = false\nfused_norm_products = true\n",
            "set device.small_batch_kernels = true",
        ),
    ],
)
def test_bad_config_names_the_key(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_small_batch_kernels_off_needs_no_second_setting_for_the_norm_they_carry(tmp_path) -> None:
    # norms_in_product_finish is on by default and lives inside the kernels: turning the kernels
    # off (W4's "kernels off" side, finite_logits.py) must not need a second setting.
    path = tmp_path / "w.toml"
    path.write_text("[device]\nsmall_batch_kernels = false\n")
    device = load_config(path).device
    assert not device.small_batch_kernels and device.norms_in_product_finish


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/no/such/file.toml")


def test_rank_hosts_place_each_groups_sockets_on_its_driver() -> None:
    from aioworker.wire.transport import group_endpoints

    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    cfg = load_config(
        overrides={
            "runtime.transport": "tcp",
            "runtime.rank_hosts": hosts,
            "runtime.base_port": 5000,
        }
    )
    group1 = group_endpoints(cfg.runtime, 1, 2)  # global ranks 2 and 3
    assert group1.tasks == "tcp://10.0.0.3:5007" and group1.dist_init == "tcp://10.0.0.3:5011"
    assert group1.heartbeats == ("tcp://10.0.0.3:5012", "tcp://10.0.0.4:5013")


def test_the_step_token_budget_is_chosen_by_device_unless_given() -> None:
    options = load_config().scheduler
    assert options.step_token_budget("cpu") == 256
    assert options.step_token_budget("cuda:1") == options.step_token_budget("cuda") == 2048
    given = load_config(overrides={"scheduler.max_num_batched_tokens": 512}).scheduler
    assert given.step_token_budget("cpu") == given.step_token_budget("cuda") == 512
    with pytest.raises(ConfigError, match="max_num_batched_tokens is -1"):
        load_config(overrides={"scheduler.max_num_batched_tokens": -1})
