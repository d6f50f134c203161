"""The training command's model flags derived from their dataclass fields (training/arguments.py): each flag names
the config field(s) it sets, the configs name the field they refuse (ConfigFieldError), and the command turns that
field into its flag; the model's flags are checked once a command."""

import dataclasses
import inspect
import pickle

import pytest

from hf_headattn.runtime.attention_base import ConfigFieldError
from hf_headattn.runtime.configuration_headattn import HeadAttnConfig
from hf_headattn.runtime.configuration_headattn_rnn import HeadAttnRNNConfig
from hf_headattn.toy_corpus import write_toy_corpus
from hf_headattn.training import arguments
from hf_headattn.training.arguments import (FAMILIES, DataArguments, ModelArguments, build_config, config_kwargs,
                                            flag_of_config_field, parse_args)

from helpers import file_flags


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory):
    return write_toy_corpus(tmp_path_factory.mktemp("data"), n_train=20, n_valid=5, seed=0)


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
def test_every_config_field_a_flag_names_is_the_configs(architecture):
    config_class = FAMILIES[architecture][0]
    accepted = set(inspect.signature(config_class.__init__).parameters)
    assert set(flag_of_config_field(architecture)) - {"max_position_embeddings"} <= accepted
    if config_class is HeadAttnConfig:
        assert "max_position_embeddings" in accepted
    model_args = ModelArguments(architecture=architecture, guided_alignment="eflomal", guided_alignment_heads="0,1")
    kwargs = config_kwargs(model_args)
    assert set(kwargs) <= accepted and kwargs["guided_alignment_heads"] == [0, 1]
    assert kwargs["guided_alignment_weight"] == arguments.DEFAULT_GUIDED_WEIGHT  # the flag's None: Garg et al.'s


def test_the_other_familys_flags_are_its_own_only():
    transformer_only, rnn_only = arguments.foreign_flags("rnn"), arguments.foreign_flags("transformer")
    assert "d_model" in transformer_only and "hops" in rnn_only
    assert not {"layers", "heads", "dropout"} & {*transformer_only, *rnn_only}
    assert {spec.name for spec in dataclasses.fields(ModelArguments)} == {
        spec.name for family in FAMILIES for spec in arguments.family_flags(family)}


def test_a_configs_refusal_carries_its_fields_and_stays_a_value_error():
    with pytest.raises(ValueError, match="does not divide d_model=256") as refused:
        HeadAttnConfig(d_model=256, encoder_attention_heads=3)
    assert isinstance(refused.value, ConfigFieldError) and refused.value.field == "encoder_attention_heads"
    with pytest.raises(ConfigFieldError) as refused:
        HeadAttnConfig(cross_attention="csparsmax")
    assert refused.value.fields == ("cross_attention",)  # a variant's own check, blamed on its site
    with pytest.raises(ConfigFieldError) as refused:
        HeadAttnRNNConfig(attention_score="dot", num_heads=2)
    assert refused.value.fields == ("attention_score", "num_heads")
    copied = pickle.loads(pickle.dumps(refused.value))
    assert copied.fields == refused.value.fields and str(copied) == str(refused.value)


def test_the_command_names_the_flags_of_the_refused_fields():
    with pytest.raises(ValueError, match=r"^--attention_score, --heads: attention_score='dot'"):
        build_config(ModelArguments(architecture="rnn", attention_score="dot", heads=2), DataArguments())
    with pytest.raises(ValueError, match=r"^--hops: `num_hops` must be a positive integer"):
        build_config(ModelArguments(architecture="rnn", hops=0), DataArguments())
    with pytest.raises(ValueError, match=r"^--ffn_dim: `encoder_ffn_dim` must be a positive integer"):
        build_config(ModelArguments(ffn_dim=0), DataArguments())


def test_the_model_flags_are_checked_once_a_command(toy_files, tmp_path, monkeypatch):
    calls = []
    checked = arguments.check_model_arguments
    monkeypatch.setattr(arguments, "check_model_arguments", lambda *given: calls.append(given) or checked(*given))
    parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "run")])
    assert len(calls) == 1
    (tmp_path / "args.yaml").write_text(f"train_source: {toy_files['train.src']}\n"
                                        f"train_target: {toy_files['train.tgt']}\noutput_dir: {tmp_path / 'b'}\n")
    parse_args([str(tmp_path / "args.yaml")])
    assert len(calls) == 2
