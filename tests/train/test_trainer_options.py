"""TorchTrainer takes Trainer's arguments by extending its signature, not repeating it."""

from __future__ import annotations

import inspect

import pytest

from cairn._src.torch.trainer import TorchTrainer
from cairn._src.train.trainer import TRAINER_OPTIONS, Trainer


def _train() -> None:
    pass


def test_the_options_name_every_keyword_argument_of_trainer() -> None:
    keywords = {name for name, parameter in inspect.signature(Trainer).parameters.items()
                if parameter.kind is parameter.KEYWORD_ONLY}
    assert keywords == TRAINER_OPTIONS


def test_torch_trainer_passes_trainers_arguments_on() -> None:
    trainer = TorchTrainer(_train, train_loop_config={"lr": 0.1})
    assert trainer.train_loop_config == {"lr": 0.1}


def test_torch_trainer_names_itself_for_an_unknown_argument() -> None:
    with pytest.raises(TypeError, match=r"TorchTrainer.__init__\(\) got an unexpected "
                       r"keyword argument 'data_loader'"):
        TorchTrainer(_train, data_loader={})  # type: ignore[call-arg]
