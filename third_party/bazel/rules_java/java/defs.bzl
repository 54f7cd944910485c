# Offline stand-in for @rules_java as seen by Bazel 4.2.3: the native Java rules under
# their rules_java names. This project builds no Java; @bazel_tools only loads the names.
java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_plugin = native.java_plugin
java_test = native.java_test
java_proto_library = native.java_proto_library
java_lite_proto_library = native.java_lite_proto_library
java_package_configuration = native.java_package_configuration
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
