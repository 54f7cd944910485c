#!/usr/bin/env bash
# Writes the install tree of install_tree.bzl (which documents the layout). Run by Bazel in
# the execution root, outside the sandbox: the other repositories' libraries and include
# directories are resolved there to their real paths on this machine.
set -euo pipefail

out="" name="" version="" static="" shared="" strip=""
headers=() libs=() flags=() defines=() includes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2" ;;
    --name) name="$2" ;;
    --version) version="$2" ;;
    --static) static="$2" ;;
    --shared) shared="$2" ;;
    --strip) strip="$2" ;;
    --header) headers+=("$2") ;;
    --lib) libs+=("$2") ;;
    --flag) flags+=("$2") ;;
    --define) defines+=("$2") ;;
    --include) includes+=("$2") ;;
    *) echo "install_tree.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done

mkdir -p "$out/include/$name" "$out/lib/pkgconfig" "$out/lib/cmake/$name"
for h in "${headers[@]}"; do
  rel="${h#"$strip"}"
  mkdir -p "$out/include/$name/$(dirname "$rel")"
  cp "$h" "$out/include/$name/$rel"
done
cp "$static" "$out/lib/lib$name.a"
cp "$shared" "$out/lib/lib$name.so"
chmod 644 "$out/lib/lib$name.a"
chmod 755 "$out/lib/lib$name.so"

# What a program compiling against the headers needs besides them, and what one linking
# the archive needs besides it (the shared library records its own dependencies).
cflags=(-std=c++17)
for d in "${includes[@]}"; do cflags+=("-I$(readlink -f "$d")"); done
for d in "${defines[@]}"; do cflags+=("-D$d"); done
static_deps=()
add_dep() {  # once each: the CUDA libraries share a directory
  local d
  for d in "${static_deps[@]}"; do [ "$d" = "$1" ] && return 0; done
  static_deps+=("$1")
}
for l in "${libs[@]}"; do
  dir="$(dirname "$(readlink -f "$l")")"
  base="$(basename "$l")"
  stem="${base#lib}"
  stem="${stem%.so}"
  stem="${stem%.a}"
  add_dep "-L$dir"
  [[ "$base" == *.so ]] && add_dep "-Wl,-rpath,$dir"
  add_dep "-l$stem"
done
for f in "${flags[@]}"; do add_dep "$f"; done

description="fsdp.cpp: a framework-free training runtime for transformers with Fully Sharded Data Parallel"
cat > "$out/lib/pkgconfig/$name.pc" <<PC
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: $name
Description: $description
Version: $version
Cflags: -I\${includedir}/$name ${cflags[*]}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -l$name
PC

cat > "$out/lib/pkgconfig/$name-static.pc" <<PC
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: $name-static
Description: $description (static archive)
Version: $version
Cflags: -I\${includedir}/$name ${cflags[*]}
Libs: \${libdir}/lib$name.a ${static_deps[*]}
PC

# CMake lists: ';'-separated.
join() { local IFS=';'; echo "$*"; }
cmake_includes=("\${_${name}_prefix}/include/$name")
for d in "${includes[@]}"; do cmake_includes+=("$(readlink -f "$d")"); done
cat > "$out/lib/cmake/$name/${name}Config.cmake" <<CMAKE
# find_package($name): the imported targets $name::$name (the shared library) and
# $name::${name}_static (the archive, with the libraries it needs). Relocatable: paths are
# taken from where this file is.
get_filename_component(_${name}_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET $name::$name)
  add_library($name::$name SHARED IMPORTED)
  set_target_properties($name::$name PROPERTIES
    IMPORTED_LOCATION "\${_${name}_prefix}/lib/lib$name.so"
    IMPORTED_SONAME "lib$name.so"
    INTERFACE_INCLUDE_DIRECTORIES "$(join "${cmake_includes[@]}")"
    INTERFACE_COMPILE_DEFINITIONS "$(join "${defines[@]}")"
    INTERFACE_COMPILE_FEATURES "cxx_std_17")
  add_library($name::${name}_static STATIC IMPORTED)
  set_target_properties($name::${name}_static PROPERTIES
    IMPORTED_LOCATION "\${_${name}_prefix}/lib/lib$name.a"
    IMPORTED_LINK_INTERFACE_LANGUAGES "CXX"
    INTERFACE_INCLUDE_DIRECTORIES "$(join "${cmake_includes[@]}")"
    INTERFACE_COMPILE_DEFINITIONS "$(join "${defines[@]}")"
    INTERFACE_COMPILE_FEATURES "cxx_std_17"
    INTERFACE_LINK_LIBRARIES "$(join "${static_deps[@]}")")
endif()
set(${name}_VERSION "$version")
set(${name}_FOUND TRUE)
CMAKE

cat > "$out/lib/cmake/$name/${name}ConfigVersion.cmake" <<CMAKE
# Compatible with a request for the same major version, not newer than this one.
set(PACKAGE_VERSION "$version")
string(REGEX MATCH "^[0-9]+" _major "\${PACKAGE_VERSION}")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION OR
   NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL _major)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE
