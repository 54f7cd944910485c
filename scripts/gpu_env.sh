# Sourced by the GPU-machine scripts: unpacks BUNDLE_DIR/bundle.tar.xz (scripts/gpu_bundle.sh)
# into $bundle and sets the environment every GPU run needs: the bundle's lib/ (OpenBLAS)
# on LD_LIBRARY_PATH, NVLink multicast off (NCCL_NVLS_ENABLE=0). FSDP_NVIDIA_LIBS may name a
# folder holding cudnn/lib and nccl/lib (e.g. a Python environment's nvidia packages) newer
# than the system's: they go first on LD_LIBRARY_PATH.
src="${1:-.device}"
bundle="${TMPDIR:-/tmp}/fsdp-bundle"
rm -rf "$bundle" && mkdir -p "$bundle" && tar xJf "$src/bundle.tar.xz" -C "$bundle"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The bundle's OpenBLAS (OpenMP build) and its Fortran runtime (scripts/gpu_bundle.sh).
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nv="${FSDP_NVIDIA_LIBS:-}"
[ -n "$nv" ] && [ -d "$nv/cudnn/lib" ] && export LD_LIBRARY_PATH="$nv/cudnn/lib:$nv/nccl/lib:${LD_LIBRARY_PATH:-}"
# No core binding: the CPU-offloaded optimizer spreads over the host's cores.
MPIRUN=(mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
# waited CMD...: runs CMD in the background and waits for it. A script that traps TERM and
# INT with `pkill -TERM -P $$` then stops CMD when an outer `timeout` stops the script; bash
# runs no trap while a foreground command runs, so CMD would otherwise outlive the script
# and keep the GPU busy.
waited() { "$@" & wait $!; }
