# install_tree: a cc_library laid out as an installed, relocatable tree, for programs built
# without Bazel (scripts/install.sh copies it to a prefix; tests/consumer builds against it):
#
#   include/NAME/...            the headers of this repository, at their paths in it
#   lib/libNAME.so              every object of the library and of every cc_library of this
#                               repository beneath it (the system's MPI and CUDA libraries
#                               stay dynamic dependencies; cudart is linked in statically)
#   lib/libNAME.a               the same objects in one archive
#   lib/pkgconfig/NAME.pc       pkg-config, for the shared library
#   lib/pkgconfig/NAME-static.pc   the same for the archive, with what it needs besides
#   lib/cmake/NAME/NAMEConfig.cmake   find_package(NAME): NAME::NAME (shared) and
#                                     NAME::NAME_static
#
# Bazel 4 has neither a static-library rule nor a way to link every object of the deps into a
# shared library (a linkshared cc_binary keeps only the objects something refers to), hence
# this rule. The files are written by install_tree.sh.

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _install_tree_impl(ctx):
    name = ctx.attr.library_name
    repo = ctx.label.workspace_name
    cc_info = ctx.attr.dep[CcInfo]

    archives = []  # this repository's libraries
    others = []  # other repositories' (.so or .a files)
    flags = []  # link options (-fopenmp, -lmpi, ...)
    for linker_input in cc_info.linking_context.linker_inputs.to_list():
        for library in linker_input.libraries:
            if linker_input.owner.workspace_name == repo:
                # Position-independent objects, as a shared library needs them.
                archive = library.pic_static_library or library.static_library
                if archive:
                    archives.append(archive)
            else:
                lib = library.dynamic_library or library.pic_static_library or library.static_library
                if lib:
                    others.append(lib)
        for flag in linker_input.user_link_flags:
            if flag not in flags:
                flags.append(flag)

    # The static archive: an ar MRI script whose ADDLIB copies every member of an archive.
    static = ctx.actions.declare_file("_%s/lib%s.a" % (ctx.label.name, name))
    script = ctx.actions.declare_file("_%s/lib%s.mri" % (ctx.label.name, name))
    ctx.actions.write(script, "".join(
        ["CREATE %s\n" % static.path] +
        ["ADDLIB %s\n" % a.path for a in archives] +
        ["SAVE\n", "END\n"],
    ))
    ctx.actions.run_shell(
        inputs = archives + [script],
        outputs = [static],
        command = "ar -M < %s" % script.path,
        mnemonic = "StaticLibrary",
        progress_message = "Archiving lib%s.a" % name,
    )

    # The shared library: every member of every archive, whole.
    shared = ctx.actions.declare_file("_%s/lib%s.so" % (ctx.label.name, name))
    cc_toolchain = find_cpp_toolchain(ctx)
    args = ctx.actions.args()
    args.add_all(["-shared", "-o", shared, "-Wl,-soname,lib%s.so" % name, "-Wl,--no-undefined"])
    args.add("-Wl,--whole-archive")
    args.add_all(archives)
    args.add("-Wl,--no-whole-archive")
    args.add_all(others)
    args.add_all(flags)
    args.add_all(["-lstdc++", "-lm"])
    ctx.actions.run(
        executable = cc_toolchain.compiler_executable,
        arguments = [args],
        inputs = depset(archives + others, transitive = [cc_toolchain.all_files]),
        outputs = [shared],
        mnemonic = "SharedLibrary",
        progress_message = "Linking lib%s.so" % name,
        use_default_shell_env = True,
    )

    # Headers of this repository; include directories and defines of the others (MPI, CUDA).
    comp = cc_info.compilation_context
    headers = [h for h in comp.headers.to_list() if h.owner.workspace_name == repo]
    root = ctx.label.workspace_root  # "" here, "external/fsdp" when used from another workspace
    system_includes = [
        d
        for d in comp.includes.to_list() + comp.system_includes.to_list()
        if d.startswith("external/") and not (root and d.startswith(root + "/"))
    ]

    out = ctx.actions.declare_directory(ctx.label.name)
    lists = ctx.actions.args()
    lists.add_all(["--out", out.path, "--name", name, "--version", ctx.attr.version])
    lists.add_all(["--static", static, "--shared", shared])
    lists.add_all(["--strip", root + "/" if root else ""])
    lists.add_all(headers, before_each = "--header")
    lists.add_all(others, before_each = "--lib")
    lists.add_all(flags, before_each = "--flag")
    lists.add_all(comp.defines.to_list(), before_each = "--define")
    lists.add_all(system_includes, before_each = "--include")
    ctx.actions.run(
        executable = ctx.executable._script,
        arguments = [lists],
        inputs = depset(headers + others + [static, shared]),
        outputs = [out],
        mnemonic = "InstallTree",
        # Outside the sandbox: external/ resolves to the real MPI and CUDA paths.
        execution_requirements = {"no-sandbox": "1"},
        progress_message = "Laying out the %s install tree" % name,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

install_tree = rule(
    implementation = _install_tree_impl,
    attrs = {
        "dep": attr.label(providers = [CcInfo], mandatory = True),
        "library_name": attr.string(mandatory = True),
        "version": attr.string(mandatory = True),
        "_script": attr.label(
            default = "//third_party/build:install_tree.sh",
            executable = True,
            cfg = "exec",
            allow_single_file = True,
        ),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)
