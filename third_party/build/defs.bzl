# Build macros shared by every folder of fsdp.cpp.

# Defines that tell C++ code whether CUDA is compiled in.
CUDA_DEFINES = select({
    "//third_party/cuda:cpu_only": ["FSDP_WITH_CUDA=0"],
    "//conditions:default": ["FSDP_WITH_CUDA=1"],
})

def if_cuda(deps, otherwise = []):
    """deps in the CUDA configuration, `otherwise` in the CPU-only one."""
    return select({
        "//third_party/cuda:cpu_only": otherwise,
        "//conditions:default": deps,
    })

def fsdp_test(name, srcs, deps = [], mpi_ranks = [], data = [], size = "small", tags = [],
              timeout = None, mpi_main = False, **kwargs):
    """A Catch2 test binary, plus one copy of it run under `mpirun -np N` per entry of
    mpi_ranks (named NAME_npN). Tests tagged [gpu] run only where a GPU is present and
    report themselves as skipped elsewhere; [mpi] tests need the MPI test main (also
    mpi_main = True: one process that runs several trainers, each of which would otherwise
    finalize MPI)."""
    main = "//tests:catch_main_mpi" if mpi_ranks or mpi_main else "//tests:catch_main"
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + [main],
        data = data,
        size = size,
        tags = tags,
        timeout = timeout,
        # One self-contained binary: it can be copied to a GPU machine, and cudart (a
        # static archive) resolves inside it. System libraries stay shared: MPI, and
        # OpenBLAS, which scripts/gpu_bundle.sh carries in the bundle's lib/.
        linkstatic = True,
        **kwargs
    )
    for n in mpi_ranks:
        native.sh_test(
            name = "%s_np%d" % (name, n),
            srcs = ["//third_party/build:mpirun_test.sh"],
            args = [str(n), "$(location :%s)" % name],
            data = [":" + name] + data,
            size = size,
            timeout = timeout,
            # Several mpirun jobs at once on a 2-core machine only slow each other down.
            tags = tags + ["exclusive"],
        )

def fsdp_sh_test(name, srcs, args, data = [], size = "medium"):
    """A shell test that runs a binary (often under mpirun) from the workspace root, with
    tests/sh_test_support.sh (a scratch directory, Open MPI kept local) at hand. Alone on
    the machine: several mpirun jobs at once on a 2-core machine slow each other down."""
    native.sh_test(
        name = name,
        size = size,
        srcs = srcs,
        args = args,
        data = data + ["//tests:sh_test_support.sh"],
        tags = ["exclusive"],
    )

def train_sh_test(name, srcs, args = ["$(location //tools/train)"], data = [], size = "medium"):
    """fsdp_sh_test of the train binary, with the recipes, the tokenizer and the text."""
    fsdp_sh_test(
        name = name,
        srcs = srcs,
        args = args,
        size = size,
        data = data + [
            "//configs",
            "//third_party/gpt2_tokenizer",
            "//third_party/text",
            "//tools/train",
        ],
    )
