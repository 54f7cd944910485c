"""fuzz_target: one fuzz target as a libFuzzer binary and as a test over its corpus."""

load("//third_party/build:defs.bzl", "fsdp_test")

def fuzz_target(name, srcs, deps, data = []):
    """NAME_corpus_test runs every file of corpus/NAME through the target in the ordinary
    build (a test like any other). NAME_fuzzer is the libFuzzer binary: it links only with
    --config=fuzz (clang, -fsanitize=fuzzer), so it is tagged manual and scripts/fuzz.sh
    builds it."""
    corpus = native.glob(["corpus/%s/*" % name])
    fsdp_test(
        name = name + "_corpus_test",
        srcs = srcs + ["corpus_test.cc"],
        deps = deps + [":fuzz_target"],
        data = corpus + data,
        local_defines = [
            'FUZZ_TARGET=\\"%s\\"' % name,
            'FUZZ_CORPUS=\\"tests/fuzz/corpus/%s\\"' % name,
        ],
    )
    native.cc_binary(
        name = name + "_fuzzer",
        srcs = srcs,
        deps = deps + [":fuzz_target"],
        data = data,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
    )
