# Third-party libraries, all from Debian packages (scripts/setup.sh installs them).
# LibTorch is found separately in LoomTorch.cmake.
set(_loom_missing_hint "run scripts/setup.sh (installs the Debian -dev packages loom needs)")

find_package(nlohmann_json 3.10 REQUIRED)
find_package(tomlplusplus 3.0 REQUIRED)
find_package(fmt 9 REQUIRED)
find_package(spdlog 1.10 REQUIRED)
find_package(CLI11 2.1 REQUIRED)
find_package(ZLIB REQUIRED)
# HMAC-SHA256 and a CSPRNG for the job secret of fault-tolerant replica groups (libssl-dev).
find_package(OpenSSL 1.1 REQUIRED COMPONENTS Crypto)
# TensorBoard event records (libprotobuf-dev, protobuf-compiler).
find_package(Protobuf 3.12 REQUIRED)
if(NOT TARGET protobuf::libprotobuf-lite OR NOT Protobuf_PROTOC_EXECUTABLE)
  message(FATAL_ERROR "protobuf (libprotobuf-dev, protobuf-compiler) not found: ${_loom_missing_hint}")
endif()

# PCRE2 (8-bit, with JIT) for tokenizer split patterns; found by file so no pkg-config is needed.
find_path(LOOM_PCRE2_INCLUDE_DIR pcre2.h)
find_library(LOOM_PCRE2_LIBRARY NAMES pcre2-8)
if(NOT LOOM_PCRE2_INCLUDE_DIR OR NOT LOOM_PCRE2_LIBRARY)
  message(FATAL_ERROR "PCRE2 not found (libpcre2-dev): ${_loom_missing_hint}")
endif()
add_library(loom::pcre2 UNKNOWN IMPORTED)
set_target_properties(loom::pcre2 PROPERTIES
  IMPORTED_LOCATION ${LOOM_PCRE2_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${LOOM_PCRE2_INCLUDE_DIR})
# zstd (libzstd-dev): .jsonl.zst / .txt.zst datasets, decompressed as a stream.
find_path(LOOM_ZSTD_INCLUDE_DIR zstd.h)
find_library(LOOM_ZSTD_LIBRARY NAMES zstd)
if(NOT LOOM_ZSTD_INCLUDE_DIR OR NOT LOOM_ZSTD_LIBRARY)
  message(FATAL_ERROR "zstd not found (libzstd-dev): ${_loom_missing_hint}")
endif()
add_library(loom::zstd UNKNOWN IMPORTED)
set_target_properties(loom::zstd PROPERTIES
  IMPORTED_LOCATION ${LOOM_ZSTD_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${LOOM_ZSTD_INCLUDE_DIR})

# SentencePiece (libsentencepiece-dev): Llama 2 / Mistral / Gemma tokenizer.model files.
find_path(LOOM_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h)
find_library(LOOM_SENTENCEPIECE_LIBRARY NAMES sentencepiece)
if(NOT LOOM_SENTENCEPIECE_INCLUDE_DIR OR NOT LOOM_SENTENCEPIECE_LIBRARY)
  message(FATAL_ERROR "sentencepiece not found (libsentencepiece-dev): ${_loom_missing_hint}")
endif()
add_library(loom::sentencepiece UNKNOWN IMPORTED)
set_target_properties(loom::sentencepiece PROPERTIES
  IMPORTED_LOCATION ${LOOM_SENTENCEPIECE_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${LOOM_SENTENCEPIECE_INCLUDE_DIR})

# ICU (libicu-dev): Unicode normalization (NFC, NFKC) of tokenizer.json normalizers.
find_package(ICU 60 COMPONENTS uc i18n)
if(NOT ICU_FOUND)
  message(FATAL_ERROR "ICU not found (libicu-dev): ${_loom_missing_hint}")
endif()

if(LOOM_BUILD_TESTS)
  find_package(GTest 1.11 REQUIRED)
endif()

foreach(_dep nlohmann_json::nlohmann_json tomlplusplus::tomlplusplus fmt::fmt spdlog::spdlog CLI11::CLI11)
  if(NOT TARGET ${_dep})
    message(FATAL_ERROR "missing dependency target ${_dep}: ${_loom_missing_hint}")
  endif()
endforeach()

# LibTorch ships its own fmt headers (a newer major version) in its include folder, which the
# compiler searches before /usr/include. spdlog from Debian is compiled against Debian's fmt, so
# every loom target must see Debian's fmt first: a folder holding only a link to it goes in front.
get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
set(LOOM_FMT_SHIM_DIR ${CMAKE_BINARY_DIR}/loom_fmt_include)
foreach(_dir IN LISTS _fmt_includes)
  if(EXISTS ${_dir}/fmt/core.h)
    file(MAKE_DIRECTORY ${LOOM_FMT_SHIM_DIR})
    file(CREATE_LINK ${_dir}/fmt ${LOOM_FMT_SHIM_DIR}/fmt SYMBOLIC)
  endif()
endforeach()
if(NOT EXISTS ${LOOM_FMT_SHIM_DIR}/fmt/core.h)
  message(FATAL_ERROR "could not locate Debian's fmt headers (libfmt-dev): ${_loom_missing_hint}")
endif()
