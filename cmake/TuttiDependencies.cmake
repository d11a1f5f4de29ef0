# Third-party dependencies as tutti_deps:: imported targets.  The Debian
# packages scripts/install_deps.sh installs provide all of them.
find_package(Threads REQUIRED)

find_package(MPI REQUIRED COMPONENTS C)
add_library(tutti_deps::mpi INTERFACE IMPORTED)
target_link_libraries(tutti_deps::mpi INTERFACE MPI::MPI_C)
# tutti uses the C API only; keep the deprecated C++ bindings out.
target_compile_definitions(tutti_deps::mpi INTERFACE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)

# OpenBLAS (CBLAS interface; tutti declares the few prototypes it uses).
find_library(TUTTI_OPENBLAS_LIBRARY NAMES openblas
  PATH_SUFFIXES openblas-pthread openblas)
if(NOT TUTTI_OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: run scripts/install_deps.sh (libopenblas-dev)")
endif()
add_library(tutti_deps::blas INTERFACE IMPORTED)
target_link_libraries(tutti_deps::blas INTERFACE ${TUTTI_OPENBLAS_LIBRARY})

find_package(nlohmann_json 3 REQUIRED)
add_library(tutti_deps::json INTERFACE IMPORTED)
target_link_libraries(tutti_deps::json INTERFACE nlohmann_json::nlohmann_json)

find_path(TUTTI_XXHASH_INCLUDE_DIR xxhash.h)
find_library(TUTTI_XXHASH_LIBRARY NAMES xxhash)
if(NOT TUTTI_XXHASH_INCLUDE_DIR OR NOT TUTTI_XXHASH_LIBRARY)
  message(FATAL_ERROR "xxHash not found: run scripts/install_deps.sh (libxxhash-dev)")
endif()
add_library(tutti_deps::xxhash INTERFACE IMPORTED)
target_include_directories(tutti_deps::xxhash INTERFACE ${TUTTI_XXHASH_INCLUDE_DIR})
target_link_libraries(tutti_deps::xxhash INTERFACE ${TUTTI_XXHASH_LIBRARY})

find_package(CURL REQUIRED)
add_library(tutti_deps::curl INTERFACE IMPORTED)
target_link_libraries(tutti_deps::curl INTERFACE CURL::libcurl)

if(TUTTI_WITH_NCCL)
  find_path(TUTTI_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
  find_library(TUTTI_NCCL_LIBRARY NAMES nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  if(NOT TUTTI_NCCL_INCLUDE_DIR OR NOT TUTTI_NCCL_LIBRARY)
    message(FATAL_ERROR "NCCL not found (set -DTUTTI_WITH_NCCL=OFF to build without it)")
  endif()
  add_library(tutti_deps::nccl INTERFACE IMPORTED)
  target_include_directories(tutti_deps::nccl INTERFACE ${TUTTI_NCCL_INCLUDE_DIR})
  target_link_libraries(tutti_deps::nccl INTERFACE ${TUTTI_NCCL_LIBRARY})
endif()
