# Repository rule that exposes the system MPI (Open MPI on Debian: libopenmpi-dev) as
# @system_mpi//:mpi. Include and library directories come from `mpicxx --showme`, so any
# MPI whose wrapper compiler answers it works; MPI_HOME may point at a non-default one.

def _showme(rctx, mpicxx, what):
    res = rctx.execute([mpicxx, "--showme:" + what])
    if res.return_code != 0:
        return None
    return res.stdout.strip().split(" ") if res.stdout.strip() else []

def _system_mpi_impl(rctx):
    mpi_home = rctx.os.environ.get("MPI_HOME", "")
    mpicxx = (mpi_home + "/bin/mpicxx") if mpi_home else rctx.which("mpicxx")
    incdirs = _showme(rctx, mpicxx, "incdirs") if mpicxx else None
    libdirs = _showme(rctx, mpicxx, "libdirs") if mpicxx else None
    if incdirs == None or libdirs == None or not incdirs:
        fail("No MPI found: install Debian's libopenmpi-dev and openmpi-bin " +
             "(or set MPI_HOME to an MPI whose bin/mpicxx answers --showme).")

    # Only the first include directory holds mpi.h; link it in as include/.
    rctx.symlink(incdirs[0], "include")
    linkopts = ["-L" + d for d in libdirs] + ["-Wl,-rpath," + d for d in libdirs] + ["-lmpi"]
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# The C API only: without these, mpi.h also declares Open MPI's (deprecated) C++ bindings,
# whose inline code refers to libmpi_cxx, which we do not link.
cc_library(
    name = "mpi",
    hdrs = glob(["include/**/*.h"]),
    defines = ["OMPI_SKIP_MPICXX=1", "MPICH_SKIP_MPICXX=1"],
    includes = ["include"],
    linkopts = %r,
)
""" % linkopts)

system_mpi = repository_rule(
    implementation = _system_mpi_impl,
    environ = ["MPI_HOME", "PATH"],
    local = True,
)
