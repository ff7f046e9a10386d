"""Quantized loading (``diffgemma_engine.loading.quantize``) on the release-format checkpoints: int8 really quantizes
(experts included, encoder still tied, smaller), runs, stays close to the float model, saves and reloads; the traps are
refused; fp8's load path ties its scales.

int8 needs torchao (``pip install "torchao==0.18.0"``): without it the tests that load are skipped, and the one
that checks the error message runs.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import torch

from diffgemma_engine.canvas.runtime import grad_mode_for
from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.loading import loadable, quantize, quantize_check
from diffgemma_engine.loading.quantize_policy import stays_unquantized

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason=quantize.TORCHAO_INSTALL)
PROMPT_TOKENS = 40
CANVAS = 32


def _load(folder: Path, method: str | None = "none", dtype: torch.dtype = torch.bfloat16, **extra: object):
    """A model loaded as the engine would load it: ``load_settings``, ``from_pretrained``, ``finish_load``."""
    from transformers import DiffusionGemmaForBlockDiffusion

    settings = quantize.load_settings(method, "cpu", folder)
    kwargs = {**settings.kwargs, **extra}
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=dtype, local_files_only=True, **kwargs)
    quantize.finish_load(model.eval(), settings.method, pre_quantized=settings.pre_quantized)
    return model


def _step_logits(model: torch.nn.Module, mode: object = None) -> torch.Tensor:
    """One denoising step as the engine runs it (encode the prompt, then the decoder with self-conditioning), on
    the same seeded prompt and canvas for every model; float32 logits (1, C, V)."""
    from transformers import DynamicCache

    from diffgemma_engine.canvas.caches import encode_prompt
    from diffgemma_engine.canvas.compiled import eager_forward
    from diffgemma_engine.canvas.sampler import score_logits

    generator = torch.Generator().manual_seed(0)
    vocab = model.config.text_config.vocab_size
    ids = torch.randint(256, vocab - 3, (1, PROMPT_TOKENS), generator=generator)
    canvas = torch.randint(256, vocab - 3, (1, CANVAS), generator=generator)
    with (mode or grad_mode_for(model))():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        length = encode_prompt(model, ids, cache)
        positions = torch.arange(length, length + CANVAS, dtype=torch.int32).unsqueeze(0)
        mask = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config,
            inputs_embeds=canvas.unsqueeze(-1),
            cache=cache,
            decoder_attention_mask=torch.ones((1, length + CANVAS), dtype=torch.bool),
        )
        forward = eager_forward(model)
        first = forward(canvas, None, mask, cache, positions)
        conditioning = score_logits(first, 0.8).logits.to(model.dtype)
        return forward(canvas, conditioning, mask, cache, positions).float()


@pytest.fixture(scope="module")
def bf16_model(release_random_dir: Path) -> torch.nn.Module:
    return _load(release_random_dir)


@pytest.fixture(scope="module")
def int8_model(release_random_dir: Path) -> torch.nn.Module:
    return _load(release_random_dir, "int8")


def _experts(model: torch.nn.Module, layer: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    return model.model.encoder.language_model.layers[layer].experts, model.model.decoder.layers[layer].experts


# -- the skip list and the methods ----------------------------------------------------------------------------


def test_the_skip_list_is_the_policy_under_transformers_matcher(release_random_dir: Path) -> None:
    from transformers import AutoConfig, DiffusionGemmaForBlockDiffusion
    from transformers.quantizers.quantizers_utils import should_convert_module

    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(AutoConfig.from_pretrained(release_random_dir))
    patterns = quantize.skip_patterns()
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    differ = [name for name in names if should_convert_module(name, patterns) != (not stays_unquantized(name))]
    assert names and not differ, differ  # every parameter: converted exactly when the policy converts it
    # A bare module name (what transformers' docs suggest) would not match a full name at all: the trap.
    assert should_convert_module("model.decoder.layers.0.router.proj.weight", ["router"])
    assert not should_convert_module("model.decoder.layers.0.router.proj.weight", patterns)


def test_int4_and_fp8_say_why_they_are_not_available_here(release_random_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="int4 is not available.*int8"):
        quantize.from_pretrained_kwargs("int4", "cpu", release_random_dir)
    with pytest.raises(ModelLoadError, match="fp8 needs a CUDA GPU of compute capability 8.9.*int8"):
        quantize.from_pretrained_kwargs("fp8", "cpu", release_random_dir)
    with pytest.raises(ModelLoadError, match="unknown quantization 'int3'"):
        quantize.load_settings("int3", "cpu", release_random_dir)
    assert quantize.load_settings(None, "cpu", release_random_dir) == quantize.LoadSettings(
        method="none", pre_quantized=False, kwargs={}
    )


def test_fp8_is_refused_on_a_gpu_before_ada(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: (8, 6))
    with pytest.raises(ModelLoadError, match="capability 8.9 or later; cuda:0 has 8.6"):
        quantize.from_pretrained_kwargs("fp8", torch.device("cuda:0"))


def test_int8_without_torchao_names_the_pip_command(release_random_dir: Path) -> None:
    missing = loadable.Environment(torchao=None, kernels=None)
    with pytest.raises(ModelLoadError, match=re.escape(quantize.TORCHAO_INSTALL)):
        quantize.from_pretrained_kwargs("int8", "cpu", release_random_dir, env=missing)


# -- int8 ------------------------------------------------------------------------------------------------------


@needs_torchao
def test_int8_converts_the_experts_keeps_one_tied_copy_and_is_smaller(bf16_model, int8_model) -> None:
    plain = quantize_check.verify_quantized(bf16_model, "none")
    report = quantize_check.verify_quantized(int8_model, "int8")
    encoder, decoder = _experts(int8_model)
    assert type(decoder.gate_up_proj).__name__ == "Int8Tensor"
    assert type(decoder.down_proj).__name__ == "Int8Tensor"
    assert type(int8_model.model.decoder.layers[0].self_attn.q_proj.weight).__name__ == "Int8Tensor"
    assert isinstance(int8_model.model.decoder.layers[0].router.proj.weight, torch.nn.Parameter)  # kept, per policy
    assert type(int8_model.model.decoder.layers[0].router.proj.weight.data) is torch.Tensor
    # Encoder and decoder: one object, one int8 storage.
    assert encoder.gate_up_proj is decoder.gate_up_proj
    assert encoder.gate_up_proj.qdata.data_ptr() == decoder.gate_up_proj.qdata.data_ptr()
    assert int8_model.model.encoder.language_model.embed_tokens.weight is int8_model.model.decoder.embed_tokens.weight
    # Int8 with a float32 scale and an int8 zero point per row: 1 + 5/64 bytes a weight at this width, not 2.
    assert report.converted_saving >= 0.40, report.summary()
    assert report.bytes < plain.bytes
    assert report.bf16_bytes == plain.bf16_bytes  # the same model, counted the same way
    assert report.bytes_by_kind["routed_experts"] <= 0.6 * plain.bytes_by_kind["routed_experts"]
    assert report.bytes_by_kind["embedding"] == plain.bytes_by_kind["embedding"]
    assert report.experts_implementation == "eager"
    assert report.grad_mode == "no_grad"
    assert "int8: weights" in report.summary()
    assert report.to_json()["converted_saving"] >= 0.40


@needs_torchao
def test_int8_runs_under_no_grad_and_not_under_inference_mode(bf16_model, int8_model) -> None:
    assert grad_mode_for(bf16_model) is torch.inference_mode
    assert grad_mode_for(int8_model) is torch.no_grad
    logits = _step_logits(int8_model)
    assert logits.shape == (1, CANVAS, int8_model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()
    # If this starts passing, torchao fixed Int8Tensor's select under inference mode and the engine may drop
    # its no_grad branch for int8.
    with pytest.raises(RuntimeError, match="version_counter for inference tensor"):
        _step_logits(int8_model, torch.inference_mode)


@needs_torchao
def test_int8_logits_are_as_close_to_float32_as_bfloat16s(release_random_dir: Path, bf16_model) -> None:
    """Against the float32 model: int8 (float32 activations) may deviate at most twice as much as bfloat16 does.

    Per-row int8 keeps about as many significant bits as bfloat16's 8-bit mantissa, so the two roundings should
    perturb the logits by the same order. An absolute tolerance means little on this random model, whose nearly
    flat logits move by 40% of their spread under bfloat16 alone; a broken scale or layout moves them by several
    times that.
    """
    reference = _step_logits(_load(release_random_dir, dtype=torch.float32))
    bf16 = _step_logits(bf16_model)
    int8 = _step_logits(_load(release_random_dir, "int8", dtype=torch.float32))
    bf16_error, int8_error = (bf16 - reference).abs(), (int8 - reference).abs()
    assert int8_error.mean() <= 2 * bf16_error.mean(), (int8_error.mean(), bf16_error.mean())
    assert int8_error.max() <= 2 * bf16_error.max(), (int8_error.max(), bf16_error.max())


@needs_torchao
def test_transformers_default_skip_list_quantizes_nothing_and_is_refused(release_random_dir: Path) -> None:
    from transformers import DiffusionGemmaForBlockDiffusion, TorchAoConfig

    config = quantize.int8_config()
    default = TorchAoConfig(config.quant_type)  # no modules_to_not_convert: every tied key is skipped
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        release_random_dir, dtype=torch.bfloat16, quantization_config=default, experts_implementation="eager"
    )
    encoder, decoder = _experts(model)
    assert type(decoder.gate_up_proj.data) is torch.Tensor  # the trap: "quantized", yet plain
    with pytest.raises(ModelLoadError, match="routed experts are not quantized.*save next to nothing"):
        quantize_check.verify_quantized(model, "int8")


@needs_torchao
def test_quantizing_after_the_load_unties_the_encoder_and_is_refused(release_random_dir: Path) -> None:
    from torchao.quantization import quantize_

    model = _load(release_random_dir, experts_implementation="eager")
    quantize_(model, quantize.int8_config().quant_type, filter_fn=None)
    encoder, decoder = _experts(model)
    assert encoder.gate_up_proj is not decoder.gate_up_proj
    with pytest.raises(ModelLoadError, match="no longer share one copy"):
        quantize_check.verify_quantized(model, "int8")


@needs_torchao
def test_the_plain_model_is_not_taken_for_a_quantized_one(bf16_model) -> None:
    with pytest.raises(ModelLoadError, match="routed experts are not quantized"):
        quantize_check.verify_quantized(bf16_model, "int8")


@needs_torchao
def test_an_int8_checkpoint_saves_smaller_and_reloads_as_it_was(
    release_random_dir: Path,
    int8_model,
    tmp_path: Path,
) -> None:
    saved = tmp_path / "int8"
    quantize.save_quantized(int8_model, saved)

    def weights(folder: Path) -> int:
        return sum(path.stat().st_size for path in folder.glob("*.safetensors"))

    assert weights(saved) < 0.75 * weights(release_random_dir)
    assert quantize.resolve_method(None, saved) == ("int8", True)
    assert quantize.resolve_method("int8", saved) == ("int8", True)
    for conflicting in ("none", "fp8"):
        with pytest.raises(ModelLoadError, match="saved quantized \\(int8"):
            quantize.resolve_method(conflicting, saved)

    reloaded = _load(saved, None)
    quantize_check.verify_quantized(reloaded, "int8")
    encoder, decoder = _experts(reloaded)
    assert encoder.gate_up_proj is decoder.gate_up_proj
    assert torch.equal(decoder.gate_up_proj.qdata, _experts(int8_model)[1].gate_up_proj.qdata)
    assert torch.equal(_step_logits(reloaded), _step_logits(int8_model))


@needs_torchao
def test_finish_load_lets_the_checkpoint_files_go(release_random_dir: Path, tmp_path: Path) -> None:
    """Left plain, the embedding, norms and buffers are views of the mapped files, and they keep every file mapped,
    with the pages read while quantizing: as much memory again as the bfloat16 weights, on a bigger checkpoint."""
    from transformers import DiffusionGemmaForBlockDiffusion

    maps = Path("/proc/self/maps")
    if not maps.is_file():
        pytest.skip("no /proc/self/maps")
    private = tmp_path / "bf16"  # files no other test's model maps
    shutil.copytree(release_random_dir, private)

    def mapped() -> set[str]:
        return {line.split()[-1] for line in maps.read_text().splitlines() if str(private) in line}

    settings = quantize.load_settings("int8", "cpu", private)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(private, dtype=torch.bfloat16, **settings.kwargs)
    assert mapped(), "the load is expected to map the checkpoint's files"
    quantize.finish_load(model, settings.method)
    assert not mapped()
    quantize_check.verify_quantized(model, "int8")  # still tied, still quantized


# -- fp8: the load path, on CPU with CUDA faked (its kernels need a GPU; no forward pass here) ------------------


def test_fp8_ties_its_scales_only_after_finish_load(release_random_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import DiffusionGemmaForBlockDiffusion

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: (9, 0))
    config = quantize.fp8_config(release_random_dir)
    assert config.weight_block_size == (32, 32)  # the k projections have 32 rows: a 64 block would skip them
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        release_random_dir, dtype=torch.bfloat16, quantization_config=config
    )
    encoder, decoder = _experts(model)
    assert type(decoder).__name__ == "FP8Experts" and decoder.gate_up_proj.dtype == torch.float8_e4m3fn
    assert encoder.gate_up_proj is decoder.gate_up_proj
    assert encoder.gate_up_proj_scale_inv is not decoder.gate_up_proj_scale_inv  # never loaded: garbage
    with pytest.raises(ModelLoadError, match="no longer share one copy.*scale_inv"):
        quantize_check.verify_quantized(model, "fp8")
    quantize.finish_load(model, "fp8")
    assert encoder.gate_up_proj_scale_inv is decoder.gate_up_proj_scale_inv
    report = quantize_check.verify_quantized(model, "fp8")
    assert report.converted_saving >= 0.40, report.summary()
    assert report.bytes_by_kind["embedding"] == report.bf16_bytes_by_kind["embedding"]


def test_the_release_gets_a_64_block_for_fp8() -> None:
    """The release's dense MLP (2,112) and expert down projection (704 inputs) are not multiples of 128."""
    root = Path(__file__).resolve().parents[2]
    assert quantize.fp8_config(root / "tests" / "data" / "release").weight_block_size == (64, 64)


def test_a_checkpoints_own_quantization_is_read_from_its_config() -> None:
    int8 = {"quant_method": "torchao", "quant_type": {"default": {"_type": "Int8WeightOnlyConfig", "_data": {}}}}
    fqn = {"_type": "FqnToConfig", "_data": {"fqn_to_config": {"re:.*": {"_type": "Int8WeightOnlyConfig"}}}}
    assert quantize.checkpoint_method({}) is None
    assert quantize.checkpoint_method({"quantization_config": int8}) == "int8"
    assert quantize.checkpoint_method({"quantization_config": {"quant_method": "torchao", "quant_type": fqn}}) == "int8"
    assert quantize.checkpoint_method({"quantization_config": {"quant_method": "fp8"}}) == "fp8"
    with pytest.raises(ModelLoadError, match="quantized with 'bitsandbytes'"):
        quantize.checkpoint_method({"quantization_config": {"quant_method": "bitsandbytes"}})


# -- the memorized checkpoint: int8 still gives its answer ---------------------------------------------------------


@pytest.mark.slow
@needs_torchao
def test_int8_gives_the_memorized_answer_of_its_float_model(release_memorized_dir: Path) -> None:
    """A trained model, whose top-1 tokens are confident: int8 denoises the canvas to the answer of the float model
    it is computed in, seed for seed (bfloat16 already answers a pad where float32 gives the answer's last token).

    The answer is the canvas up to its first end-of-sequence token, as the engine cuts it: past it, where the
    model was not trained, a position may hold another stop token than the float model's (the checkpoint's weights
    differ in their last bits with the CPU threads that trained it)."""
    from transformers import AutoTokenizer, DynamicCache

    from diffgemma_engine.canvas.caches import encode_prompt
    from diffgemma_engine.canvas.denoise import denoise_canvas
    from diffgemma_engine.canvas.sampler import SamplerSettings
    from diffgemma_engine.loading.model import DEFAULT_MAX_PROMPT_TOKENS
    from diffgemma_engine.request.infill import cut_at_eos
    from diffgemma_engine.shared.prompt import PromptParts, layout_for
    from tests.support.release_format import ANSWERED_LANGUAGE, ANSWERED_PREFIX, ANSWERED_SUFFIX

    tokenizer = AutoTokenizer.from_pretrained(release_memorized_dir)
    parts = PromptParts(prefix=ANSWERED_PREFIX, suffix=ANSWERED_SUFFIX, language=ANSWERED_LANGUAGE)
    ids = layout_for(tokenizer).prompt(parts, DEFAULT_MAX_PROMPT_TOKENS).ids

    # Near-greedy: int8 moves the logits in their last bits, and under the released temperatures (0.8 -> 0.4) that
    # alone can change a draw (CI: the int8 answer left bfloat16's at its 13th token); what int8 must keep is the
    # float model's choice of token.
    near_greedy = SamplerSettings(t_min=1e-3, t_max=1e-3)

    def answer(model: torch.nn.Module) -> list[int]:
        with grad_mode_for(model)():
            cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            encode_prompt(model, torch.tensor([ids]), cache)
            # denoise_canvas is decorated with inference_mode; its body is what the engine would run under no_grad
            run = denoise_canvas.__wrapped__
            canvas = model.config.canvas_length  # the canvas it was trained on, which its fixture checks it answers on
            tokens = run(model, cache, 1, canvas, near_greedy, torch.Generator().manual_seed(0)).tokens[0]
        config = model.generation_config
        return cut_at_eos(tokens.tolist(), set(config.eos_token_id), config.pad_token_id)[0]

    bf16 = answer(_load(release_memorized_dir))
    assert "return a +" in tokenizer.decode(bf16)
    assert answer(_load(release_memorized_dir, "int8")) == bf16
    fp32 = answer(_load(release_memorized_dir, dtype=torch.float32))
    assert answer(_load(release_memorized_dir, "int8", dtype=torch.float32)) == fp32
