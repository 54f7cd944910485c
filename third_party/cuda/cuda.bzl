# cuda_library: compiles .cu files with the toolkit's nvcc and wraps the objects in a
# cc_library, so CUDA code links like any other C++ library.
#
#   cuda_library(name, srcs = [*.cu], hdrs = [...], deps = [cc_library...], copts = [...])
#
# The GPU architectures come from --define=cuda_archs=90,100 (default 90 = sm_90, Hopper).
# In the CPU-only configuration (--config=cpu) the library is empty and nvcc never runs.

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

def _cuda_objects_impl(ctx):
    if not ctx.attr.enabled:
        return [DefaultInfo(files = depset([]))]
    if not CUDA_FOUND:
        fail("cuda_library %s: no CUDA toolkit found (set CUDA_HOME, or build with --config=cpu)" % ctx.label)

    cc = [d[CcInfo].compilation_context for d in ctx.attr.deps if CcInfo in d]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in cc])
    includes = depset(transitive = [c.includes for c in cc] + [c.quote_includes for c in cc] +
                                   [c.system_includes for c in cc])
    defines = depset(transitive = [c.defines for c in cc])

    archs = ctx.var.get("cuda_archs", "90").split(",")
    gencode = []
    for a in archs:
        gencode += ["-gencode", "arch=compute_%s,code=sm_%s" % (a, a)]

    # The highest arch also embeds PTX so newer GPUs can JIT it.
    gencode += ["-gencode", "arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1])]

    opt = ["-O3", "-DNDEBUG"] if ctx.var.get("COMPILATION_MODE") == "opt" else ["-O2", "-lineinfo"]
    objects = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_cuda_objs/%s/%s.o" % (ctx.label.name, src.basename))
        args = ctx.actions.args()
        args.add_all(["-c", src.path, "-o", out.path])
        args.add_all(["-std=c++17", "--expt-relaxed-constexpr", "--objdir-as-tempdir",
                      "-Xcompiler", "-fPIC", "-I."])
        args.add_all(opt)
        args.add_all(gencode)
        args.add_all(includes, before_each = "-I")
        args.add_all(defines, format_each = "-D%s")
        args.add_all(ctx.attr.copts)
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(out)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "enabled": attr.bool(default = True),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    _cuda_objects(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:headers"],
        copts = copts,
        enabled = select({
            "//third_party/cuda:cpu_only": False,
            "//conditions:default": True,
        }),
    )
    native.cc_library(
        name = name,
        srcs = select({
            "//third_party/cuda:cpu_only": [],
            "//conditions:default": [":" + name + "_objs"],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//third_party/cuda:cpu_only": [],
            "//conditions:default": ["@local_cuda//:cudart"],
        }),
        visibility = visibility,
        **kwargs
    )
