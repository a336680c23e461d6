"""Megatron-LM flags that launch scripts carry over, and what each means here.

A Megatron-LM GPT / MoE script passes many flags that select implementations (fusions, Transformer
Engine, grouped GEMMs) or restate an architecture ZAYA1 fixes (RMSNorm, SwiGLU, RoPE, no biases).
pretrain_zaya.py accepts them so such a script runs unchanged, and refuses, naming the flag, a value
that asks for something this code does not do (LayerNorm, dropout, an auxiliary loss, pipeline
parallelism) instead of silently training something else.

IMPLIED_SWITCHES: on/off flags whose behaviour is always what this code does.
FIXED_VALUES: flags whose only accepted values are the ones ZAYA1 implies (any other stops the run;
an empty tuple refuses every value, None accepts any); those in LIST_VALUED take a list, as in Megatron-LM
(nargs='+'), each of whose values is checked.
REFUSED_SWITCHES: switches that ask for something this code does not do (they stop the run).
resolve_aliases: folds in Megatron-LM's names for settings this code spells otherwise.
WANDB_FLAGS: accepted with a warning; scalars go to TensorBoard, which `wandb sync` can upload.
WARNED_SWITCHES: accepted with a warning saying what is not measured or served here (--log-energy).
The flags that do something here (--recompute-activations, --lr-warmup-init, --manual-gc,
--distributed-timeout-minutes) are ordinary flags of megatron_zaya/flags.py.
"""
from __future__ import annotations

import argparse

from megatron_zaya.training.config import TrainConfig

IMPLIED_SWITCHES = {
    "--use-mcore-models": "the model is this repository's own",
    "--use-flash-attn": "attention goes through scaled_dot_product_attention, which picks a flash kernel where "
                        "it can",
    "--no-masked-softmax-fusion": "no masked-softmax kernel here",
    "--no-bias-swiglu-fusion": "there are no linear biases; SwiGLU is fused where kernels are on",
    "--no-bias-dropout-fusion": "no biases and no dropout",
    "--no-rope-fusion": "RoPE is fused where kernels are on",
    "--attention-softmax-in-fp32": "the attention softmax always runs in fp32",
    "--accumulate-allreduce-grads-in-fp32": "gradients are always accumulated and reduced in fp32",
    "--overlap-grad-reduce": "gradient buckets are always reduced while the backward runs",
    "--overlap-param-gather": "ZeRO-1 gathers the new weights after the optimizer step",
    "--no-gradient-accumulation-fusion": "no fused weight-gradient accumulation here",
    "--cross-entropy-loss-fusion": "the cross-entropy is always computed in chunks, or by the Triton kernel",
    "--calculate-per-token-loss": "the loss is always the mean over all loss-mask tokens of the global batch",
    "--moe-grouped-gemm": "experts always run as grouped matmuls",
    "--lazy-mpu-init": "the process groups are made once, by this code, before the model",
    "--use-tp-pp-dp-mapping": "the rank grid's order is this code's own (tensor-parallel ranks adjacent)",
    "--trust-remote-code": "no tokenizer code is downloaded or run: tokenizers are local files",
    "--use-persistent-ckpt-worker": "an --async-save is written by a background thread of each rank",
    "--one-logger-async": "no one-logger here: TensorBoard gets the scalars",
    "--moe-router-enable-expert-bias": "ZAYA1's balancing biases are always on (--no-moe-router-bias-update "
                                       "turns their update off)",
    "--swiglu": "the experts are SwiGLU",
    "--disable-bias-linear": "no linear layer has a bias",
    "--group-query-attention": "--num-query-groups sets the KV heads, also without this switch (which "
                               "Megatron-LM needs to read --num-query-groups at all)",
    "--qk-layernorm": "CCA normalises queries and keys",
    "--ckpt-fully-parallel-save": "every rank writes its own part of a checkpoint; a replicated tensor (each "
                                  "row share of a large one) is written by one rank of its group, the model "
                                  "spread over the group",
    "--ckpt-fully-parallel-load": "every rank reads only its own part: a replicated tensor (each row share of "
                                  "a large one) is read by one rank of its group and broadcast",
    "--exit-signal-handler": "SIGTERM and SIGUSR1 always save a checkpoint and exit",
    "--override-opt_param-scheduler": "the LR and weight-decay schedules come from this run's flags "
                                      "(--use-checkpoint-opt_param-scheduler takes the checkpoint's instead)",
    "--override-opt-param-scheduler": "the same as --override-opt_param-scheduler",
    "--moe-permute-fusion": "the MoE permute / unpermute is fused where kernels are on",
    "--moe-router-pre-softmax": "ZAYA1's gate is the softmax over all classes, taken before the top-1 choice",
    "--no-create-attention-mask-in-dataloader": "batches carry no attention mask (causal attention is implicit)",
    "--use-rotary-position-embeddings": "the model uses (partial) RoPE",
    "--use-cpu-initialization": "weights are initialised on the CPU, then moved to the device",
    "--check-for-nan-in-loss-and-grad": "a non-finite loss or gradient norm always skips the step and names the "
                                        "rank and layer",
    "--no-check-for-nan-in-loss-and-grad": "the non-finite check is one scalar per step and stays on",
    "--use-dist-ckpt": "checkpoints are always sharded per rank and reshardable, like torch_dist",
    "--auto-detect-ckpt-format": "--load recognises this code's checkpoints and names a Megatron-LM one",
    "--ckpt-assume-constant-structure": "checkpoint writes do not depend on it",
    "--use-precision-aware-optimizer": "optimizer state, master weights and main gradients are fp32 (the only "
                                       "--main-grads-dtype / --exp-avg-dtype accepted)",
    "--enable-experimental": "no experimental features to enable",
    "--no-position-embedding": "there is no learned position embedding (RoPE)",
    "--no-async-tensor-model-parallel-allreduce": "tensor-parallel all-reduces run in order with the compute",
    "--no-ckpt-fully-parallel-save": "every rank writes its own shard files in any case",
    "--log-loss-scale-to-tensorboard": "there is no loss scale with bf16 (no --fp16)",
    "--te-rng-tracker": "no Transformer Engine; nothing random in the forward (no dropout)",
    "--ddp-average-in-collective": "gradients are summed over ranks against a loss already divided by the global "
                                   "batch's loss tokens: the exact single-process average",
    "--moe-use-legacy-grouped-gemm": "experts always run as grouped matmuls (torch._grouped_mm)",
    "--fp32-residual-connection": "the residual stream is always fp32 (ZAYA1)",
    "--no-initialization": "a run that loads a checkpoint's weights never initialises them",
    "--init-model-with-meta-device": "a run that loads a checkpoint's weights builds the model on the meta device "
                                     "and allocates it uninitialised; a new one initialises on the CPU",
    "--no-persist-layer-norm": "no persistent layer-norm kernel here",
    "--no-bias-gelu-fusion": "no bias-GeLU fusion here (the router's GeLU runs unfused)",
    "--no-log-loss-scale-to-tensorboard": "there is no loss scale with bf16 (no --fp16)",
    "--moe-router-fusion": "the router's softmax and top-1 choice run in fp32 as they are (no fused router kernel)",
    "--no-align-grad-reduce": "there is no pipeline parallelism, so no pipeline stages whose reductions to align",
    "--no-align-param-gather": "there is no pipeline parallelism, so no pipeline stages whose gathers to align",
    "--align-param-gather": "there is no pipeline parallelism, so no pipeline stages whose gathers to align",
    "--no-log-learning-rate-to-tensorboard": "TensorBoard always gets learning-rate (one scalar per logged step)",
    "--disable-gloo-process-groups": "no Gloo group is made beside the NCCL/RCCL ones (Gloo is the backend only "
                                     "on CPU)",
    "--log-batch-size-to-tensorboard": "TensorBoard always gets batch-size",
    "--legacy-tokenizer": "the tokenizers are Megatron-LM's --tokenizer-type ones",
    "--no-one-logger": "there is no one-logger telemetry",
    "--ddp-reduce-scatter-with-fp32-accumulation": "gradients are always reduced in fp32",
    "--ddp-pad-buckets-for-high-nccl-busbw": "gradient buckets keep their --ddp-bucket-size / --ddp-num-buckets size",
    "--no-gradient-reduce-div-fusion": "gradients need no division after the reduction: the loss is already divided "
                                       "by the global batch's loss tokens",
    "--no-fp8-wgrad": "there is no FP8 here: weight gradients are bf16 or fp32",
    "--no-pin-cpu-grads": "nothing is offloaded to the CPU",
    "--no-pin-cpu-params": "nothing is offloaded to the CPU",
    "--no-overlap-p2p-communication": "there is no pipeline parallelism, so no point-to-point communication",
    "--no-scatter-gather-tensors-in-pipeline": "there is no pipeline parallelism",
    "--overlap-param-gather-with-optimizer-step": "there is no pipeline parallelism; ZeRO-1 gathers the new weights "
                                                  "after the optimizer step",
    "--no-barrier-with-level-1-timing": "the timers add no barriers",
}

# Switches that ask for something this code does not do: each stops the run with what to use instead.
REFUSED_SWITCHES = {
    "--fp16": "train with --bf16 (ZAYA1 trained in bf16; no loss scaling here)",
    "--moe-router-padding-for-fp8": "no FP8 here: train with --bf16",
    "--distribute-saved-activations": "activations are not split over tensor-parallel ranks: use "
                                      "--sequence-parallel, or --recompute-granularity full",
    "--use-torch-fsdp2": "shard with --use-distributed-optimizer (ZeRO-1), as ZAYA1 did",
    "--tp-comm-overlap": "tensor-parallel communication is not overlapped with compute here; drop the flag",
    "--moe-pad-expert-input-to-capacity": "experts are dropless (no capacity to pad to)",
    "--disable-straggler-on-startup": "there is no straggler controller to switch it on later: give "
                                      "--log-straggler to report stragglers, or neither flag",
    "--squared-relu": "the experts are SwiGLU (ZAYA1)",
    "--apply-layernorm-1p": "ZAYA1's RMSNorm weights are used as they are (no 1 + w form)",
    "--rotary-interleaved": "RoPE rotates the two halves of each head's rotary part (ZAYA1, as transformers)",
    "--use-rope-scaling": "for longer context ZAYA1 raises --rotary-base instead",
    "--multi-latent-attention": "attention is CCA (ZAYA1), not multi-latent attention",
    "--grad-reduce-in-bf16": "gradients are reduced in fp32 (the planner's --grad-dtype bf16 only estimates it)",
    "--optimizer-cpu-offload": "optimizer state stays on the device; shard it with --use-distributed-optimizer",
    "--first-last-layers-bf16": "there is no FP8 here, so every layer already runs in bf16",
    "--inprocess-restart": "faults are recovered by restarting the job from its last checkpoint (run_mi300x.sh)",
    "--enable-ft-package": "faults are recovered by restarting the job from its last checkpoint (run_mi300x.sh); "
                           "hangs end with stacks by the watchdog",
    "--check-for-spiky-loss": "no re-run state machine: a non-finite step is skipped and diagnosed by rank and layer",
    "--check-for-large-grads": "no re-run state machine: a non-finite step is skipped and diagnosed by rank and layer",
    "--use-legacy-models": "there is one model implementation",
    "--add-qkv-bias": "CCA's projections have no bias (ZAYA1)",
    "--openai-gelu": "the experts are SwiGLU and the router's GeLU is the exact one (ZAYA1)",
    "--quick-geglu": "the experts are SwiGLU (ZAYA1)",
    "--apply-query-key-layer-scaling": "it serves fp16 training (no --fp16 here); CCA's QK-norm bounds the "
                                       "attention logits",
    "--fp16-lm-cross-entropy": "train with --bf16; the cross-entropy runs in fp32",
    "--moe-apply-probs-on-input": "the gate multiplies the expert's output (ZAYA1)",
    "--moe-shared-expert-overlap": "ZAYA1 has no shared expert",
    "--moe-use-upcycling": "the model is trained from scratch or from a ZAYA checkpoint (--pretrained-checkpoint)",
    "--moe-enable-deepep": "experts are dispatched by all-to-all over the expert-parallel group",
    "--overlap-moe-expert-parallel-comm": "the experts' all-to-all is not overlapped with compute here",
    "--use-megatron-fsdp": "shard with --use-distributed-optimizer (ZeRO-1), as ZAYA1 did",
    "--data-parallel-random-init": "every data-parallel replica starts from the same weights",
    "--test-mode": "no real-time test mode; the test suite is tests/ (README)",
    "--checkpoint-activations": "it is Megatron-LM's old name: use --recompute-activations, or "
                                "--recompute-granularity and --recompute-method",
    "--apply-residual-connection-post-layernorm": "ZAYA1's blocks are pre-norm: the residual is the sublayer's "
                                                  "input, before its RMSNorm",
    "--init-method-xavier-uniform": "weights start from N(0, --init-method-std) (megatron_zaya/model/zaya.py)",
    "--enable-cuda-graph": "no CUDA graphs: the experts' row counts change every step",
    "--external-cuda-graph": "no CUDA graphs: the experts' row counts change every step",
    "--fp8-param-gather": "no FP8 here: train with --bf16 (ZAYA1 trained in bf16)",
    "--moe-extended-tp": "it is Megatron-LM's old switch: experts are split over --expert-model-parallel-size, "
                         "then over the tensor-parallel group",
    "--qk-l2-norm": "CCA normalises queries and keys with its own QK-norm and key temperature (ZAYA1)",
    "--delay-wgrad-compute": "weight gradients are computed as the backward reaches them; drop the flag",
    "--defer-embedding-wgrad-compute": "there is no pipeline parallelism to defer the embedding's weight "
                                       "gradient into; drop the flag",
}

# flag -> (dest, accepted values as the command line spells them, what to use instead)
FIXED_VALUES = {
    "--normalization": ("normalization", ("RMSNorm",), "ZAYA1 uses RMSNorm"),
    "--position-embedding-type": ("position_embedding_type", ("rope",), "ZAYA1 uses (partial) RoPE"),
    "--transformer-impl": ("transformer_impl", ("local", "transformer_engine"), ""),
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", ("alltoall",),
                                    "experts are dispatched by all-to-all"),
    "--moe-router-load-balancing-type": ("moe_router_load_balancing_type", ("none",),
                                         "ZAYA1 balances with router biases and no auxiliary loss"),
    "--moe-aux-loss-coeff": ("moe_aux_loss_coeff", ("0",), "ZAYA1 balances with router biases and no auxiliary loss"),
    "--moe-z-loss-coeff": ("moe_z_loss_coeff", ("0",), "there is no router z-loss"),
    "--moe-router-dtype": ("moe_router_dtype", ("fp32",), "the router always runs in fp32"),
    "--hidden-dropout": ("hidden_dropout", ("0",), "dropout is not implemented (ZAYA1 pretrains without it)"),
    "--attention-dropout": ("attention_dropout", ("0",), "dropout is not implemented (ZAYA1 pretrains without it)"),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", ("1",),
                                       "there is no pipeline parallelism: use --expert-model-parallel-size, "
                                       "--tensor-model-parallel-size or --context-parallel-size"),
    "--dataloader-type": ("dataloader_type", ("single",),
                          "the sampler is Megatron-LM's single pass in a fixed shuffled order"),
    "--ckpt-format": ("ckpt_format", ("torch_dist",),
                      "checkpoints are always sharded per rank and reshardable, like torch_dist"),
    "--moe-layer-freq": ("moe_layer_freq", ("1",), "every ZAYA1 block is MoE"),
    "--moe-router-score-function": ("moe_router_score_function", ("softmax",), "the ZAYA1 router scores with a softmax"),
    "--moe-expert-capacity-factor": ("moe_expert_capacity_factor", (), "experts are dropless"),
    "--moe-token-drop-policy": ("moe_token_drop_policy", ("probs", "position"),
                                "experts are dropless, so no token is dropped by either policy"),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", ("0",),
                                              "ZAYA1 has no shared expert"),
    "--moe-router-topk-scaling-factor": ("moe_router_topk_scaling_factor", ("1",), "the gate is the unscaled softmax"),
    "--moe-router-num-groups": ("moe_router_num_groups", (), "no group-limited routing (top-1 over all experts)"),
    "--moe-router-group-topk": ("moe_router_group_topk", (), "no group-limited routing (top-1 over all experts)"),
    "--kv-lora-rank": ("kv_lora_rank", (), "attention is CCA, not multi-latent attention"),
    "--rotary-seq-len-interpolation-factor": ("rotary_seq_len_interpolation_factor", ("1",),
                                              "for longer context ZAYA1 raises --rotary-base instead"),
    "--num-layers-per-virtual-pipeline-stage": ("num_layers_per_virtual_pipeline_stage", (),
                                                "there is no pipeline parallelism"),
    "--decoder-first-pipeline-num-layers": ("decoder_first_pipeline_num_layers", (),
                                            "there is no pipeline parallelism"),
    "--num-distributed-optimizer-instances": ("num_distributed_optimizer_instances", ("1",),
                                              "one ZeRO-1 instance over the whole data-parallel group"),
    "--main-grads-dtype": ("main_grads_dtype", ("fp32",), "gradients are accumulated and reduced in fp32"),
    "--main-params-dtype": ("main_params_dtype", ("fp32",), "master weights are fp32"),
    "--exp-avg-dtype": ("exp_avg_dtype", ("fp32",), "Adam's moments are fp32"),
    "--exp-avg-sq-dtype": ("exp_avg_sq_dtype", ("fp32",), "Adam's moments are fp32"),
    "--attention-backend": ("attention_backend", ("auto", "flash", "fused", "unfused", "local"),
                            "attention goes through scaled_dot_product_attention"),
    "--cp-comm-type": ("cp_comm_type", ("p2p", "all_gather", "a2a", "a2a+p2p"),
                       "context parallelism all-gathers K/V whatever the type"),
    "--timing-log-level": ("timing_log_level", ("0", "1", "2"),
                           "the console line has the time per iteration; TensorBoard always gets its split "
                           "(batch-generator-time, forward-backward-time, optimizer-time)"),
    "--softmax-type": ("softmax_type", ("vanilla",), "attention uses the plain softmax"),
    "--rope-type": ("rope_type", ("rope",), "ZAYA1 uses (partial) RoPE"),
    "--window-size": ("window_size", (), "CCA attends to the whole causal context"),
    "--rotary-scaling-factor": ("rotary_scaling_factor", ("1",),
                                "for longer context ZAYA1 raises --rotary-base instead"),
    "--moe-input-jitter-eps": ("moe_input_jitter_eps", (), "no router input jitter"),
    "--loss-scale": ("loss_scale", (), "no loss scaling with bf16 (no --fp16)"),
    "--initial-loss-scale": ("initial_loss_scale", (), "no loss scaling with bf16 (no --fp16)"),
    "--min-loss-scale": ("min_loss_scale", (), "no loss scaling with bf16 (no --fp16)"),
    "--loss-scale-window": ("loss_scale_window", (), "no loss scaling with bf16 (no --fp16)"),
    "--hysteresis": ("hysteresis", (), "no loss scaling with bf16 (no --fp16)"),
    "--timing-log-option": ("timing_log_option", ("max", "minmax", "all"),
                            "the console line times this rank; --log-straggler adds the slowest and fastest ranks"),
    "--train-sync-interval": ("train_sync_interval", None,
                              "the host waits for each step's device work when it is timed"),
    "--cross-entropy-fusion-impl": ("cross_entropy_fusion_impl", ("native", "te"),
                                    "the loss is fused where kernels are on"),
    "--dist-ckpt-strictness": ("dist_ckpt_strictness", ("assume_ok_unexpected", "log_unexpected", "log_all",
                                                        "raise_unexpected", "raise_all", "return_unexpected",
                                                        "return_all", "ignore_all"),
                               "a load always stops on a missing or unexpected tensor, naming it"),
    "--rerun-mode": ("rerun_mode", ("disabled",),
                     "no re-run state machine: a non-finite step is skipped, diagnosed by rank and layer, and "
                     "three in a row stop the run"),
    "--fp8-format": ("fp8_format", (), "no FP8 here: train with --bf16 (ZAYA1 trained in bf16)"),
    "--fp8-recipe": ("fp8_recipe", (), "no FP8 here: train with --bf16 (ZAYA1 trained in bf16)"),
    "--exit-signal": ("exit_signal", ("SIGTERM", "SIGUSR1", "signal.SIGTERM", "signal.SIGUSR1"),
                      "SIGTERM and SIGUSR1 both save a checkpoint and exit"),
    "--batch-size": ("batch_size", (), "Megatron-LM's old name: use --micro-batch-size"),
    "--warmup": ("warmup", (), "Megatron-LM's old name: use --lr-warmup-iters, --lr-warmup-samples or "
                               "--lr-warmup-fraction"),
    "--model-parallel-size": ("model_parallel_size", (), "Megatron-LM's old name: use --tensor-model-parallel-size"),
    "--head-lr-mult": ("head_lr_mult", ("1",), "there is no classification head; --decoupled-lr gives the "
                                               "embedding and output layer their own lr"),
    "--mtp-num-layers": ("mtp_num_layers", ("0",), "no multi-token prediction: ZAYA1 predicts the next token"),
    "--cuda-graph-impl": ("cuda_graph_impl", ("none",), "no CUDA graphs: the experts' row counts change every step"),
    "--cuda-graph-scope": ("cuda_graph_scope", None, "it only scopes --cuda-graph-impl's graphs"),
    "--fp8-margin": ("fp8_margin", None, "it only tunes --fp8-format, which is refused"),
    "--fp8-interval": ("fp8_interval", None, "it only tunes --fp8-format, which is refused"),
    "--fp8-amax-history-len": ("fp8_amax_history_len", None, "it only tunes --fp8-format, which is refused"),
    "--fp8-amax-compute-algo": ("fp8_amax_compute_algo", None, "it only tunes --fp8-format, which is refused"),
    "--num-layers-at-start-in-bf16": ("num_layers_at_start_in_bf16", None, "no FP8 here: every layer runs in bf16"),
    "--num-layers-at-end-in-bf16": ("num_layers_at_end_in_bf16", None, "no FP8 here: every layer runs in bf16"),
    "--cpu-offloading-num-layers": ("cpu_offloading_num_layers", ("0",),
                                    "activations stay on the device: recompute them instead "
                                    "(--recompute-granularity, --recompute-modules)"),
    "--dist-ckpt-format": ("dist_ckpt_format", ("torch_dist",),
                           "checkpoints are always sharded per rank and reshardable, like torch_dist"),
    "--distributed-timeout-seconds-after-init": ("distributed_timeout_seconds_after_init", (),
                                                 "one timeout for the whole run: --distributed-timeout-minutes"),
    "--tokenizer-metadata": ("tokenizer_metadata", (), "tokenizers are built from --tokenizer-type and "
                                                      "--tokenizer-model (Megatron-LM's legacy tokenizers)"),
    "--decoder-last-pipeline-num-layers": ("decoder_last_pipeline_num_layers", (), "there is no pipeline parallelism"),
    "--mtp-loss-scaling-factor": ("mtp_loss_scaling_factor", None, "it only scales --mtp-num-layers' loss (0 here)"),
    "--vocab-extra-ids": ("vocab_extra_ids", ("0",), "no T5 sentinel tokens in a GPT vocabulary"),
    "--encoder-seq-length": ("encoder_seq_length", (), "give the sequence length as --seq-length"),
    "--hierarchical-context-parallel-sizes": ("hierarchical_context_parallel_sizes", (),
                                              "context parallelism is one group: --context-parallel-size"),
    "--moe-upcycling-granularity": ("moe_upcycling_granularity", ("1",), "no upcycling of a dense checkpoint"),
    "--sgd-momentum": ("sgd_momentum", None, "it only tunes --optimizer sgd, which is not offered"),
    "--nccl-communicator-config-path": ("nccl_communicator_config_path", None,
                                        "NCCL's communicators take their defaults"),
    "--straggler-ctrlr-port": ("straggler_ctrlr_port", None, "--log-straggler reports the slowest ranks itself"),
    "--one-logger-project": ("one_logger_project", None, "no one-logger here: TensorBoard gets the scalars"),
    "--one-logger-run-name": ("one_logger_run_name", None, "no one-logger here: TensorBoard gets the scalars"),
    "--app-tag-run-name": ("app_tag_run_name", None, "no one-logger here: TensorBoard gets the scalars"),
    "--app-tag-run-version": ("app_tag_run_version", None, "no one-logger here: TensorBoard gets the scalars"),
    "--log-memory-interval": ("log_memory_interval", None, "every console line has the peak memory (`mem:`)"),
}


WANDB_FLAGS = ("--wandb-project", "--wandb-exp-name", "--wandb-save-dir", "--wandb-entity")
# Switches accepted with a warning: what they would log is not measured here.
WARNED_SWITCHES = {
    "--log-energy": "the GPUs' energy is not read here (no NVML / amdsmi counter); the console line and TensorBoard "
                    "have tokens/s and TFLOP/s per device",
    "--log-device-memory-used": "the device's memory in use by all its processes (nvidia-smi's figure) is not read "
                                "here; each console line has this process's peak (`mem:`), TensorBoard its "
                                "`mem-*-bytes`",
    "--run-workload-inspector-server": "no workload inspector server here; --profile --use-pytorch-profiler writes a "
                                       "torch.profiler trace",
}


def moe_layer_entries(pattern: str) -> int | None:
    """The number of blocks --moe-layer-freq's list form ("[1]*40", "([1]*40)", "[1,1,1]") makes MoE when it
    makes every one MoE; None for any other value (a 0 in it, an empty list, the pattern form "1")."""
    import ast
    import re

    text = pattern.strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    repeated = re.fullmatch(r"\[\s*1\s*\]\s*\*\s*(\d+)", text)
    if repeated:
        ones = [1] * int(repeated.group(1))
    else:
        try:
            ones = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
    every = isinstance(ones, list) and len(ones) > 0 and all(v == 1 for v in ones)
    return len(ones) if every else None


def _same(word: str, accepted: str) -> bool:
    try:
        return float(word) == float(accepted)
    except ValueError:
        return word == accepted


# FIXED_VALUES that Megatron-LM's parser takes as lists (--cuda-graph-scope attn moe_router, a --cp-comm-type per
# layer, the hierarchical sizes)
LIST_VALUED = {"--cuda-graph-scope", "--cp-comm-type", "--hierarchical-context-parallel-sizes"}


def add_megatron_flags(parser: argparse.ArgumentParser) -> None:
    """Accept every flag above (one argument group, described in --help)."""
    g = parser.add_argument_group("Megatron-LM flags accepted for compatibility (docs: megatron_zaya/megatron_flags.py)")
    for flag, meaning in IMPLIED_SWITCHES.items():
        g.add_argument(flag, action="store_true", help=f"accepted: {meaning}")
    for flag, (dest, accepted, why) in FIXED_VALUES.items():
        g.add_argument(flag, dest=dest, default=None, metavar="VALUE", nargs="+" if flag in LIST_VALUED else None,
                       help=f"accepted: any value ({why})" if accepted is None
                       else f"accepted: {' or '.join(accepted)}" if accepted else f"refused: {why}")
    for flag, instead in REFUSED_SWITCHES.items():
        g.add_argument(flag, action="store_true", help=f"refused: {instead}")
    g.add_argument("--expert-tensor-parallel-size", type=int, default=None,
                   help="accepted when equal to --tensor-model-parallel-size (experts are split like the "
                        "dense layers)")
    g.add_argument("--ffn-hidden-size", type=int, default=None,
                   help="the experts' hidden size when --moe-ffn-hidden-size is not given (as in Megatron-LM); "
                        "every ZAYA1 block is MoE, so there is no dense FFN for it to size otherwise")
    g.add_argument("--num-dataset-builder-threads", type=int, default=None,
                   help="accepted: the dataset indices are built by one thread per rank (and cached)")
    g.add_argument("--moe-router-bias-update-rate", type=float, default=None,
                   help="Megatron-LM's step of the expert-bias update: here the lr of the balancing biases' "
                        "Adam (--moe-router-bias-lr), whose steps are also about this size")
    g.add_argument("--local-rank", "--local_rank", type=int, default=None,
                   help="accepted (torch.distributed.launch passes it): the local rank comes from LOCAL_RANK, "
                        "or from Slurm / MPI")
    for flag in WANDB_FLAGS:
        g.add_argument(flag, default=None, metavar="VALUE",
                       help="accepted with a warning: no Weights & Biases logging here; scalars go to --tensorboard-dir")
    for flag, why in WARNED_SWITCHES.items():
        g.add_argument(flag, action="store_true", help=f"accepted with a warning: {why}")


def fold_ffn_hidden_size(args: argparse.Namespace) -> None:
    """--ffn-hidden-size as --moe-ffn-hidden-size when that is not given (in place; also for the tools that
    take the model flags), remembered for typed_flag_message."""
    if args.moe_ffn_hidden_size is None and args.ffn_hidden_size is not None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
        args.typed_aliases = getattr(args, "typed_aliases", {}) | {"--moe-ffn-hidden-size": "--ffn-hidden-size"}


def typed_flag_message(message: str, args: argparse.Namespace) -> str:
    """An error message that starts with a setting's flag and value (`--moe-ffn-hidden-size=0: ...`) where that
    value came from a Megatron-LM alias names the flag the user typed: `--ffn-hidden-size=0
    (--moe-ffn-hidden-size): ...`. Other messages are returned as they are."""
    for setting, alias in getattr(args, "typed_aliases", {}).items():
        value, separator, rest = message[len(setting) + 1:].partition(": ")
        if message.startswith(setting + "=") and separator:
            return f"{alias}={value} ({setting}): {rest}"
    return message


def resolve_aliases(args: argparse.Namespace) -> list[str]:
    """Fold the Megatron-LM aliases into this code's settings (in place; typed_flag_message names the alias in
    an error about its value); returns warnings to print. ValueError when an alias and its own flag disagree."""
    fold_ffn_hidden_size(args)
    rate, lr = args.moe_router_bias_update_rate, args.moe_router_bias_lr
    if rate is not None and lr is not None and rate != lr:
        raise ValueError(f"--moe-router-bias-update-rate={rate} and --moe-router-bias-lr={lr} set the same step: "
                         f"give one of them")
    if rate is not None and lr is None:
        args.typed_aliases = getattr(args, "typed_aliases", {}) | {
            "--moe-router-bias-lr": "--moe-router-bias-update-rate"}
    args.moe_router_bias_lr = rate if rate is not None else lr if lr is not None else TrainConfig.moe_router_bias_lr
    if args.optimizer == "adam":          # Megatron-LM's adam is AdamW (decoupled weight decay)
        args.optimizer = "adamw"
    warnings = [f"{flag}: {why}" for flag, why in WARNED_SWITCHES.items() if getattr(args, flag[2:].replace("-", "_"))]
    given = [f for f in WANDB_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    if given:
        where = args.tensorboard_dir or "nowhere (add --tensorboard-dir)"
        warnings.append(f"{', '.join(given)}: Weights & Biases logging is not implemented; scalars go to TensorBoard "
                        f"at {where} (`wandb sync --sync-tensorboard DIR` uploads them)")
    return warnings


def preset_shape_warning(args: argparse.Namespace, model, preset_model, preset: str) -> str | None:
    """A Megatron-LM script that resizes the model (--hidden-size, --num-attention-heads other than the preset's)
    and leaves out the flags Megatron derives from those gets the preset's values for them here: said, naming
    each one whose preset value differs from Megatron's derivation. None when nothing differs."""
    if (model.hidden_size, model.num_attention_heads) == (preset_model.hidden_size, preset_model.num_attention_heads):
        return None
    hidden, heads = model.hidden_size, model.num_attention_heads
    ffn = int(4 * hidden * 2 / 3 / 64) * 64 if args.swiglu else 4 * hidden     # Megatron's --ffn-hidden-size
    derived = [("kv_channels", hidden // heads, "hidden / heads"), ("rotary_percent", 1.0, "its default"),
               ("moe_ffn_hidden_size", ffn, "from hidden" + (" with --swiglu" if args.swiglu else ""))]
    if not args.group_query_attention:
        derived.insert(1, ("num_query_groups", heads, "heads, without --group-query-attention"))
    differ = [(name, want, how) for name, want, how in derived
              if getattr(args, name) is None and getattr(model, name) != want]
    if not differ:
        return None
    kept = ", ".join(f"--{name.replace('_', '-')} {getattr(model, name)}" for name, _, _ in differ)
    megatron = ", ".join(f"{want} ({how})" for _, want, how in differ)
    return (f"--preset {preset} keeps its {kept} (flags not given), where Megatron-LM would derive {megatron}; "
            f"give the flags to choose")


def check_moe_layer_freq(args: argparse.Namespace, num_layers: int) -> None:
    """--moe-layer-freq's list form against the model's layers (--num-layers', the preset's or the checkpoint's):
    one entry per layer, as Megatron-LM requires, then Megatron-LM's pattern form of "every block is MoE", "1".
    ValueError naming both counts otherwise."""
    entries = None if args.moe_layer_freq is None else moe_layer_entries(args.moe_layer_freq)
    if entries is None:
        return
    if entries != num_layers:
        raise ValueError(f"--moe-layer-freq={args.moe_layer_freq} has {entries} entries, and the model {num_layers} "
                         f"layers: one entry per layer (as in Megatron-LM)")
    args.moe_layer_freq = "1"


def check_megatron_flags(args: argparse.Namespace) -> None:
    """ValueError naming the first flag whose value this code does not do; --moe-layer-freq's list form of all
    ones is counted against the model's layers once those are known (check_moe_layer_freq)."""
    for flag, instead in REFUSED_SWITCHES.items():
        if getattr(args, flag[2:].replace("-", "_")):
            raise ValueError(f"{flag} is not supported: {instead}")
    etp, tp = args.expert_tensor_parallel_size, args.tensor_model_parallel_size
    if etp is not None and etp != tp:
        raise ValueError(f"--expert-tensor-parallel-size={etp} is not supported: experts are split over the "
                         f"tensor-parallel group (--tensor-model-parallel-size={tp}); give the same size or drop it")
    for flag, (dest, accepted, why) in FIXED_VALUES.items():
        value = getattr(args, dest)
        if dest == "moe_layer_freq" and value is not None and moe_layer_entries(value) is not None:
            continue
        values = value if isinstance(value, list) else [value]
        if value is not None and accepted is not None and not all(any(_same(v, a) for a in accepted) for v in values):
            only = f"only {' or '.join(accepted)}" if accepted else "drop the flag"
            shown = " ".join(values) if isinstance(value, list) else value
            raise ValueError(f"{flag}={shown} is not supported: {only}" + (f" ({why})" if why else ""))


def check_tool_megatron_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What a tool that takes the model flags (model_stats.py, estimate.py) does after parsing: check_megatron_flags,
    its refusal as the parser's one-line error (exit 2), then --ffn-hidden-size folded in."""
    try:
        check_megatron_flags(args)
    except ValueError as err:
        parser.error(str(err))
    fold_ffn_hidden_size(args)
