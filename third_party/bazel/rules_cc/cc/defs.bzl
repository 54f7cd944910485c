# Offline stand-in for @rules_cc as seen by Bazel 4.2.3.
#
# Bazel 4.2.3's own @bazel_tools loads "@rules_cc//cc:defs.bzl" and would download
# rules_cc on first use. These names are the native rules under their rules_cc names,
# which is all that Bazel 4.2.3 and this project need.
cc_binary = native.cc_binary
cc_library = native.cc_library
cc_test = native.cc_test
cc_import = native.cc_import
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
cc_proto_library = native.cc_proto_library
objc_library = native.objc_library
objc_import = native.objc_import
fdo_profile = native.fdo_profile
fdo_prefetch_hints = native.fdo_prefetch_hints
