"""cairn.DataConfig: Ray Train's arguments, checked where they are given."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cairn import ConfigError, DataConfig, Trainer

ray_data = pytest.importorskip("ray.data")


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_behind() -> Iterator[None]:
    # Building a ray.data dataset starts Ray in this process: the next module starts its own.
    import ray

    before = ray.is_initialized()
    yield
    if not before and ray.is_initialized():
        ray.shutdown()


def test_the_defaults_are_ray_s() -> None:
    config = DataConfig()
    assert config.datasets_to_split == "all"
    assert config.execution_options is None
    assert config.enable_shard_locality is True
    assert config.split_names(["train", "eval"]) == {"train", "eval"}
    assert DataConfig(["train"]).split_names(["train", "eval"]) == {"train"}


def test_datasets_to_split_is_all_or_a_list_of_names() -> None:
    with pytest.raises(ConfigError, match=r"DataConfig\.datasets_to_split='train': "
                       r"`datasets_to_split` should be a 'all' or a list of strings of dataset "
                       r"names; a single name goes in a list: datasets_to_split=\['train'\]"):
        DataConfig(datasets_to_split="train")
    with pytest.raises(ConfigError, match=r"DataConfig\.datasets_to_split=5: "
                       r"`datasets_to_split` should be a 'all' or a list of strings of dataset "
                       r"names, such as \['train'\] \(received int\)"):
        DataConfig(datasets_to_split=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"datasets_to_split=\['train', ''\]"):
        DataConfig(datasets_to_split=["train", ""])


def test_execution_options_are_ray_data_s() -> None:
    options = DataConfig.default_ingest_options()
    assert isinstance(options, ray_data.ExecutionOptions)
    assert DataConfig(execution_options=options).execution_options_for("x") is not options
    per_name = DataConfig(execution_options={"train": options})
    assert per_name.execution_options_for("train").preserve_order == options.preserve_order
    with pytest.raises(ConfigError, match=r"DataConfig\.execution_options=list must be a "
                       r"ray.data.ExecutionOptions, a dict of dataset names to them, or None"):
        DataConfig(execution_options=[{}])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"DataConfig\.execution_options=\{'train': int\}: a "
                       r"dict of execution options maps dataset names to "
                       r"ray.data.ExecutionOptions"):
        DataConfig(execution_options={"train": 3})


def test_enable_shard_locality_is_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"DataConfig\.enable_shard_locality='yes' must be "
                       r"True or False"):
        DataConfig(enable_shard_locality="yes")  # type: ignore[arg-type]


def test_the_trainer_checks_its_dataset_config() -> None:
    with pytest.raises(ConfigError, match=r"Trainer\(dataset_config=\{\}\) must be a "
                       r"cairn.DataConfig \(or ray.train.DataConfig\)"):
        Trainer(lambda: None, dataset_config={})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"DataConfig\(datasets_to_split=\['eval'\]\) names "
                       r"'eval', which Trainer\(datasets=...\) does not have; it has 'train'"):
        Trainer(lambda: None, datasets={"train": ray_data.range(4)},
                dataset_config=DataConfig(datasets_to_split=["eval"]))
    # Without datasets, a DataConfig is kept for later, as in Ray's guides.
    assert Trainer(lambda: None, dataset_config=DataConfig(["train"])).data_config == \
        DataConfig(["train"])
