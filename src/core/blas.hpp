#pragma once
// Matrix products through OpenBLAS, and the thread count shared by OpenMP and OpenBLAS.
// All matrices are fp32 row-major; names follow BLAS: C = alpha * op(A) op(B) + beta * C with
// op(A) [m, k], op(B) [k, n], C [m, n] and leading dimensions (row strides) lda, ldb, ldc.
#include <cstdint>

namespace pf {

// Large products run on our OpenMP threads (OpenBLAS single-threaded per slice); see blas.cpp.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// y [n] = alpha * W [n, k] x [k] + beta * y: one row through a row-major weight (a Linear's forward
// of a single token, generate's), without the packing of W a product of one row pays in gemm.
void gemv(int64_t n, int64_t k, float alpha, const float* w, int64_t ldw, const float* x, float beta, float* y);
// The same product by OpenBLAS's own threading (the reference the benchmark compares against).
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Sets OpenMP's and OpenBLAS's thread counts together (n <= 0: all cores). Results are
// deterministic for a fixed thread count.
void set_threads(int n);
int num_threads();

// Address space OpenBLAS maps for each thread that runs its kernels: one buffer of BUFFER_SIZE
// bytes, mapped at a thread's first call and kept. Debian's 0.3.21 maps 32 << 22 = 128 MiB
// (strace: one 134217728-byte mmap per OpenBLAS worker at start-up and per calling thread); its
// allocator retries a failed mmap forever, so under `ulimit -v` a run must leave room for these
// before it starts (config/limits.hpp), or it spins instead of failing.
constexpr double kBlasBufferBytes = 128.0 * 1024 * 1024;
// Threads OpenBLAS runs now: its pool's workers (one fewer) have each mapped their buffer.
int blas_threads();

// Runs BLAS single-threaded for its lifetime (inside our own OpenMP loops over many small
// products, e.g. attention per head), restoring the previous count after.
class BlasSingleThread {
 public:
  BlasSingleThread();
  ~BlasSingleThread();
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int saved_;
};

}  // namespace pf
