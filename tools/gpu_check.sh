#!/usr/bin/env bash
# GPU check for vlmdata: run on a machine with an NVIDIA GPU, offline.
#
#   tools/gpu_check.sh                 run every check, print a summary, exit 1 if any failed
#   tools/gpu_check.sh --download-wheels   (on a machine WITH network) fill ./wheels for an offline run
#
# Checks, in order (CPU-only ones first, so a GPU-less machine still checks what it can):
#   env          python + torch, Pillow, DALI, vlmdata import (missing packages are installed from
#                ./wheels with --no-index when that folder exists)
#   dali-cpu     DALI CPU decoder tests (tests/decode/dali/test_cpu.py, test_pipeline.py)
#   gpu          nvidia-smi lists a GPU and torch sees CUDA (a CPU-only torch build fails here, clearly)
#   dali-mixed   DaliGpuStage with device="mixed": fixed and dynamic packs on the GPU, bf16, a corrupt
#                JPEG costs one image; pixels match the DALI-CPU stage within tolerance
#   dali-video   defer_decode's video stage: DaliVideoPipeline with device="mixed" (NVDEC) decodes the
#                sampled frames (2 fps) of H.264, MPEG-4, VP9 and VP8 clips made with PyAV; each is PyAV's
#                frame of that index within the YUV->RGB tolerance; frames/s next to PyAV's seeking decoder.
#                DALI's wheel (nvidia-dali-cuda120) is not on the lent GPU machines: this step needs it
#                from ./wheels (--download-wheels) or an install; without it the env step fails first
#   bench        tools/bench_decode.py --require-gpu: DALI mixed images/s next to DALI-CPU and Pillow
#   loader-gpu   tools/bench_gpu_loader.py: the memmap path's host-to-device rate (pinned and straight from
#                the packs' shared memory, next to a plain 256 MiB H2D copy) and DALI mixed decode images/s
#                end to end (tar shards, defer_decode, DaliGpuStage in the training process)
#   attention    vlmdata_pipelines.attention: each CUDA varlen backend equals the reference (if vlmdata_pipelines/ exists)
#   attn-bench   tools/bench_attention.py: time and peak memory of each varlen backend vs padded SDPA
#   telemetry    tests/pipelines/test_telemetry.py + test_profiling.py on the GPU: NVML and allocator
#                metrics, and the profiler's step breakdown from CUDA kernels (sums to the step time)
#   train        a few steps of vlmdata_pipelines.train under torchrun, fixed and dynamic images (if present);
#                the images must be decoded by DaliGpuStage in the training process (--decode-stage
#                auto on a GPU; dali-cpu in the dry run); the fixed-size run is profiled (--profile 2)
#
# GPU_CHECK_DRY=1 runs the GPU steps on the CPU instead (DALI "cpu" for "mixed", reference attention,
# CPU training) to test this script on a machine without a GPU; the result is still FAIL there.
#
# Python: the repo's .venv when present, else $PYTHON or python3. Outputs go to $GPU_CHECK_OUT
# (default: a new temp dir), e.g. bench-decode-gpu.md and the training logs.
#
# Offline wheels: on a machine with network and the same OS/Python (3.11, x86_64), run
#   tools/gpu_check.sh --download-wheels
# which does `pip download -d wheels` of the CUDA build of torch (TORCH_INDEX, default the cu126
# index), nvidia-dali-cuda120 and the project's dependencies; copy the repo with wheels/ along.
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
if [ -x "$here/.venv/bin/python" ]; then PY="$here/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
OUT="${GPU_CHECK_OUT:-$(mktemp -d -t vlmdata-gpu-check.XXXXXX)}"
mkdir -p "$OUT"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
DALI_SPEC="nvidia-dali-cuda120==2.4.0"

if [ "${1:-}" = "--download-wheels" ]; then
    mkdir -p wheels
    "$PY" -m pip download -d wheels --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cu126}" "$TORCH_SPEC"
    "$PY" -m pip download -d wheels "$DALI_SPEC" pillow-simd==12.1.1.post0 --no-binary pillow-simd
    "$PY" -m pip download -d wheels ".[test]"
    echo "wheels/ ready: copy the repository (with wheels/) to the GPU machine and run tools/gpu_check.sh"
    exit 0
fi

declare -a NAMES STATUS SECS DETAIL
record() {  # name status seconds detail
    NAMES+=("$1"); STATUS+=("$2"); SECS+=("$3"); DETAIL+=("$4")
    printf '\n=== %-10s %s (%ss) %s\n' "$1" "$2" "$3" "$4"
}
run_step() {  # name detail-on-failure command...
    local name="$1" detail="$2"; shift 2
    local t0=$SECONDS log="$OUT/$name.log" rc
    echo; echo "--- $name: $*"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then
        record "$name" PASS $((SECONDS - t0)) ""
        return 0
    fi
    record "$name" FAIL $((SECONDS - t0)) "$detail (log: $log)"
    return 1
}
skip() { record "$1" SKIP 0 "$2"; }

echo "vlmdata GPU check | repo $here | python $PY | outputs $OUT"
echo "host: $(uname -srm) | $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') | $(nproc) cores"

# ---- env ----------------------------------------------------------------------------------
missing_pkgs() {
    "$PY" - <<'EOF'
import importlib.util
need = {"torch": "torch", "PIL": "pillow-simd", "nvidia.dali": "nvidia-dali-cuda120", "numpy": "numpy",
        "webdataset": "webdataset", "pytest": "pytest"}
def absent(mod):
    try:
        return importlib.util.find_spec(mod) is None
    except ModuleNotFoundError:   # parent package missing
        return True
print(" ".join(pkg for mod, pkg in need.items() if absent(mod)))
EOF
}
env_step() {
    local miss
    miss="$(missing_pkgs)"
    if [ -n "$miss" ]; then
        if [ -d wheels ]; then
            echo "installing from ./wheels (offline): $miss"
            "$PY" -m pip install --no-index --find-links wheels $miss || return 1
        else
            echo "missing packages: $miss (no ./wheels folder: run tools/gpu_check.sh --download-wheels on a networked machine)"
            return 1
        fi
    fi
    # a CPU-only torch (the default .venv) on a GPU machine: swap in the CUDA build from ./wheels
    if command -v nvidia-smi >/dev/null 2>&1 && ls wheels/torch-*.whl >/dev/null 2>&1 \
        && "$PY" -c "import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)" 2>/dev/null; then
        echo "replacing the CPU-only torch with the CUDA build from ./wheels (offline)"
        "$PY" -m pip install --no-index --find-links wheels --force-reinstall "$TORCH_SPEC" || return 1
    fi
    if ! "$PY" -c "import vlmdata" 2>/dev/null; then
        "$PY" -m pip install --no-index --no-deps --no-build-isolation -e . || return 1
    fi
    "$PY" - <<'EOF'
import PIL, torch, nvidia.dali, vlmdata
print(f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) | PIL {PIL.__version__} | "
      f"DALI {nvidia.dali.__version__} | vlmdata {getattr(vlmdata, '__version__', '?')}")
EOF
}
run_step env "python environment incomplete" env_step

# ---- DALI CPU (no GPU needed) ---------------------------------------------------------------
run_step dali-cpu "DALI CPU decoder tests failed" "$PY" -m pytest -q -p no:cacheprovider tests/decode/dali/test_cpu.py tests/decode/dali/test_pipeline.py

# ---- GPU present? ---------------------------------------------------------------------------
gpu_step() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then echo "nvidia-smi not found: no NVIDIA driver here"; return 1; fi
    nvidia-smi -L || return 1
    "$PY" - <<'EOF'
import sys, torch
if torch.version.cuda is None:
    sys.exit("torch is a CPU-only build: install a CUDA build (put its wheel in ./wheels, or "
             "TORCH_SPEC/--index-url https://download.pytorch.org/whl/cu126)")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable CUDA device")
print("torch sees", torch.cuda.device_count(), "GPU(s):", torch.cuda.get_device_name(0))
EOF
}
HAVE_GPU=0
run_step gpu "no usable NVIDIA GPU" gpu_step && HAVE_GPU=1

# ---- DALI mixed stage -----------------------------------------------------------------------
mixed_step() {
    "$PY" - "$OUT" "$MIXED" <<'EOF'
import io, subprocess, sys, pathlib
import numpy as np, torch
from PIL import Image
from vlmdata.decode.dali.gpu import DaliGpuStage, GpuStageOptions
from vlmdata.decode.policy import DynamicPolicy, FixedPolicy
out = pathlib.Path(sys.argv[1]) / "raw-mixed"
gen = pathlib.Path("..") / "shared" / "bench" / "gen_raw.py"
subprocess.run([sys.executable, str(gen), str(out), "--samples", "40", "--seed", "5"], check=True, capture_output=True)
data = [p.read_bytes() for p in sorted((out / "images").glob("*.jpg"))][:32]
sizes = np.array([Image.open(io.BytesIO(b)).size for b in data], np.int32)
bad = list(data); bad[5] = bad[5][: len(bad[5]) // 3]; bad[9] = b"<html>not an image</html>" * 20
ok = True
for policy in (FixedPolicy(336), DynamicPolicy()):
    gpu = DaliGpuStage(policy, GpuStageOptions(device=sys.argv[2], device_id=0, dtype="bfloat16"))
    cpu = DaliGpuStage(policy, GpuStageOptions(device="cpu", dtype="float32"))
    g, c = gpu.decode(bad, sizes), cpu.decode(bad, sizes)
    pv = g.pixel_values
    diff = (pv.float().cpu() - c.pixel_values).abs() * 68.0   # ~back to 0-255 units (std ~ 0.27 * 255)
    line = (f"{type(policy).__name__}: device {pv.device} dtype {pv.dtype} shape {tuple(pv.shape)} bad {g.bad} "
            f"| mixed vs cpu: mean {diff.mean():.2f} p99 {diff.flatten()[::97].quantile(0.99):.2f} (0-255 units)")
    print(line)
    ok &= (pv.is_cuda or sys.argv[2] == "cpu") and pv.dtype == torch.bfloat16 and g.bad == [5, 9] and c.bad == [5, 9]
    ok &= pv.shape == c.pixel_values.shape and float(diff.mean()) <= 2.0
    if g.image_grid is not None:
        ok &= torch.equal(g.image_grid.cpu(), c.image_grid) and torch.equal(g.vision_cu_seqlens.cpu(), c.vision_cu_seqlens)
sys.exit(0 if ok else "DALI mixed stage disagrees with the CPU stage (see above)")
EOF
}
video_step() {
    "$PY" - "$MIXED" <<'EOF'
import io, sys, time
import av, numpy as np
from vlmdata.decode.dali import DALI_VIDEO_CODECS, DaliVideoPipeline, VideoStageOptions
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import VideoPolicy, decode_frames, probe_clip
device = sys.argv[1]
specs = {"h264": ClipSpec(codec="libx264", frames=900, fps=30, width=640, height=360, gop=60),
         "mpeg4": ClipSpec(container="mkv", codec="mpeg4", frames=300, fps=30, width=320, height=240),
         "vp9": ClipSpec(container="webm", codec="libvpx-vp9", frames=300, fps=30, width=320, height=240),
         "vp8": ClipSpec(container="webm", codec="libvpx", frames=300, fps=30, width=320, height=240)}
pipe, ok = DaliVideoPipeline(VideoStageOptions(device=device, device_id=0 if device == "mixed" else None)), True
for name, spec in specs.items():
    if name not in DALI_VIDEO_CODECS[device]:
        print(f"{name}: not decoded by DALI {device} (the stage falls back to PyAV)"); continue
    data = make_clip(spec)
    info = probe_clip(data)
    idx = VideoPolicy(max_frames=768).frame_indices(info.frames, info.measured_fps)   # 2 fps sampling
    t = time.perf_counter(); (got,) = pipe.run([np.frombuffer(data, np.uint8)], [idx]); dali_s = time.perf_counter() - t
    t = time.perf_counter(); ref = np.stack(decode_frames(data, info, idx)); cpu_s = time.perf_counter() - t
    diff = np.abs(got.astype(np.int16) - ref)
    with av.open(io.BytesIO(data)) as c:
        every = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.int16)
    k = len(idx) // 2                         # the middle sampled frame is PyAV's frame of that index
    same = int(np.abs(got[k].astype(np.int16)[None] - every).reshape(len(every), -1).mean(1).argmin()) == idx[k]
    print(f"{name}: {len(idx)} frames of {info.frames} | vs PyAV mean {diff.mean():.2f} max {diff.max()} levels "
          f"| identity {same} | DALI {device} {len(idx) / dali_s:.0f} frames/s (first call, incl. build), "
          f"PyAV seeking {len(idx) / cpu_s:.0f} frames/s")
    ok &= got.shape == ref.shape and float(diff.mean()) <= 5.0 and same
sys.exit(0 if ok else "DALI video frames disagree with PyAV's (see above)")
EOF
}
bench_step() {
    "$PY" tools/bench_decode.py $REQUIRE_GPU --samples 200 --threads "1,$(nproc)" --rounds 2 \
        --out "$OUT/bench-decode-gpu.md" && cat "$OUT/bench-decode-gpu.md"
}
loader_gpu_step() {
    "$PY" tools/bench_gpu_loader.py --device "$LOADER_DEVICE" --samples 300 --epochs 3 \
        --cache "$OUT/corpus" --out "$OUT/bench-gpu-loader.md"
}
attention_step() {
    "$PY" - "$ATTN_DEVICE" <<'EOF'
import sys, torch
from vlmdata_pipelines.attention import available_backends, varlen_attention
dev, dt = torch.device(sys.argv[1]), torch.bfloat16
names = available_backends(dev, dt)
print("varlen backends on", torch.cuda.get_device_name(0) if dev.type == "cuda" else dev, "bf16:", names)
lens = [37, 128, 5, 300]
cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
q, k, v = (torch.randn(sum(lens), 4, 64, device=dev, dtype=dt) for _ in range(3))
ref = varlen_attention(q, k, v, cu, max(lens), causal=True, backend="reference")
bad = []
for n in names:
    out = varlen_attention(q, k, v, cu, max(lens), causal=True, backend=n)
    err = (out.float() - ref.float()).abs().max().item()
    print(f"  {n:10s} max abs diff vs reference {err:.4f}")
    if err > 0.05:
        bad.append(n)
sys.exit(f"backends disagree with the reference: {bad}" if bad else 0)
EOF
}
attn_bench_step() {
    "$PY" tools/bench_attention.py $REQUIRE_GPU --device "$ATTN_DEVICE" $ATTN_BENCH_ARGS \
        --out "$OUT/bench-attention-$ATTN_DEVICE.md"
}
telemetry_step() {
    "$PY" -m pytest -q -rs -p no:cacheprovider tests/pipelines/test_telemetry.py tests/pipelines/test_profiling.py
}
train_step() {
    local ds="$OUT/train-ds" rc=0
    # a file, not stdin: the sharding engine starts worker processes that re-import __main__
    cat > "$OUT/make_train_ds.py" <<'EOF'
import sys
from vlmdata_pipelines.corpus import generate
from vlmdata.ingest import ShardConfig, shard_dataset
if __name__ == "__main__":
    out = sys.argv[1]
    generate(f"{out}/train-raw", 160, 0)
    shard_dataset(ShardConfig(inputs=[f"{out}/train-raw/data.jsonl"], output=f"{out}/train-ds",
                              max_samples_per_shard=40, workers=1))
EOF
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$OUT/make_train_ds.py" "$OUT" || return 1
    for size in 56 dynamic; do
        "$PY" -m torch.distributed.run --nproc_per_node 1 -m vlmdata_pipelines.train --data "$ds" --steps 6 \
            --image-size "$size" --max-tokens 2048 --num-workers 2 --decoder auto --attn-backend auto \
            --decode-stage "$DECODE_STAGE" --out "$OUT/train-$size" \
            $( [ "$size" = 56 ] && echo --profile 2 ) || { rc=1; continue; }
        # --decoder auto must decode in the training process (DaliGpuStage: nvJPEG; DALI CPU in the dry run)
        "$PY" - "$OUT/train-$size/result.rank0.json" "$size" <<'EOF' || rc=1
import json, math, sys
r = json.load(open(sys.argv[1]))
losses, stage = r["losses"], r.get("decode_stage")
print(f"image-size {sys.argv[2]}: device {r['device']} decode {stage or 'DataLoader workers'} "
      f"(stage {r.get('stage_seconds', 0):.2f} s) data-wait {100 * r['data_wait_fraction']:.1f}% "
      f"losses {[round(x, 3) for x in losses]}")
if len(losses) != 6 or not all(math.isfinite(x) for x in losses):
    sys.exit("bad losses")
if stage != "DaliGpuStage":
    sys.exit("--decoder auto should decode with DaliGpuStage in the training process here")
for w in r.get("profile", []):  # the profiled run: its breakdown must add up to the measured step time
    print(f"profile steps {w['steps']}: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in w["shares"].items()))
    if abs(w["total_seconds"] - w["measured_seconds"]) > 0.05 * w["measured_seconds"]:
        sys.exit("the profiler's phases do not add up to the measured step time")
EOF
    done
    return $rc
}
MIXED=mixed REQUIRE_GPU=--require-gpu ATTN_DEVICE=cuda DECODE_STAGE=auto ATTN_BENCH_ARGS="" LOADER_DEVICE=cuda
if [ "${GPU_CHECK_DRY:-0}" = 1 ] && [ "$HAVE_GPU" = 0 ]; then
    echo "GPU_CHECK_DRY=1: running the GPU steps on the CPU (script self-test)"
    MIXED=cpu REQUIRE_GPU="" ATTN_DEVICE=cpu DECODE_STAGE=dali-cpu ATTN_BENCH_ARGS="--tokens 2048 --packs 1 --rounds 1"
    LOADER_DEVICE=cpu
fi
if [ "$HAVE_GPU" = 1 ] || [ "$MIXED" = cpu ]; then
    run_step dali-mixed "DALI mixed decode failed" mixed_step
    run_step dali-video "DALI video decode failed" video_step
    run_step bench "decode benchmark failed" bench_step
    run_step loader-gpu "GPU loader benchmark failed" loader_gpu_step
    if [ -f vlmdata_pipelines/attention.py ]; then run_step attention "varlen attention check failed" attention_step
    else skip attention "vlmdata_pipelines/attention.py not present"; fi
    run_step attn-bench "attention benchmark failed" attn_bench_step
    run_step telemetry "GPU telemetry / profiler tests failed" telemetry_step
    if [ -f vlmdata_pipelines/train.py ] && [ -f vlmdata_pipelines/corpus.py ]; then run_step train "training steps failed" train_step
    else skip train "vlmdata_pipelines/train.py not present"; fi
else
    for s in dali-mixed dali-video bench loader-gpu attention attn-bench telemetry train; do skip "$s" "needs an NVIDIA GPU"; done
fi

# ---- summary ------------------------------------------------------------------------------
echo; echo "================ vlmdata GPU check summary ================"
fail=0
for i in "${!NAMES[@]}"; do
    printf '%-11s %-5s %5ss  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${DETAIL[$i]}"
    [ "${STATUS[$i]}" = FAIL ] && fail=1
done
for f in "$OUT/bench-decode-gpu.md" "$OUT/bench-gpu-loader.md"; do
    [ -f "$f" ] && { echo; echo "--- $(basename "$f") (rows for BENCHMARKS.md)"; grep '^|' "$f"; }
done
if [ "$HAVE_GPU" = 0 ]; then
    if [ "$MIXED" = cpu ]; then echo "RESULT: FAIL - no usable NVIDIA GPU (GPU steps ran on the CPU: GPU_CHECK_DRY=1)"
    else echo "RESULT: FAIL - no usable NVIDIA GPU: the GPU checks did not run"; fi
    exit 1
fi
[ "$fail" = 0 ] && { echo "RESULT: PASS (outputs in $OUT)"; exit 0; }
echo "RESULT: FAIL (logs in $OUT)"; exit 1
