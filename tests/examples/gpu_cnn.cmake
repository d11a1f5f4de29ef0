# examples/gpu_cnn: the CPU fallback on two ranks (host tensors through the
# same Reducer code path over MPI), and the GPU path (cuDNN, cuBLAS, NCCL;
# exits 77 = skipped without a GPU).  Both run the --check verification
# first; small buckets so the reducer has several to launch during backward.
set(_gpu_cnn_env "${TUTTI_TEST_ENV};TUTTI_BUCKET_MB=0.02;TUTTI_FIRST_BUCKET_MB=0.004")
tutti_example_test(gpu_cnn_cpu 2 gpu_cnn --cpu --steps 100 --check)
set_tests_properties(example_gpu_cnn_cpu_np2 PROPERTIES ENVIRONMENT "${_gpu_cnn_env}")
tutti_example_test(gpu_cnn 1 gpu_cnn --gpu --check)
set_tests_properties(example_gpu_cnn_np1 PROPERTIES
  ENVIRONMENT "${_gpu_cnn_env}" SKIP_RETURN_CODE 77 LABELS "examples;np1;gpu")
