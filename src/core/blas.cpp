#include "core/blas.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <thread>

namespace pf {

static void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Width of the pieces C is cut into: 2 per thread (more pieces are smaller, slower products;
// bench/RESULTS.md, "Any machine"), so that a thread that loses its core delays one piece while the
// others take the rest (core/parallel.hpp); multiples of 16 and at least 64 wide, so each piece
// still runs OpenBLAS's kernels at full speed.
static int64_t piece_width(int64_t len, int threads) {
  const int64_t wanted = 2 * static_cast<int64_t>(threads);
  return std::max<int64_t>(64, ((len + wanted - 1) / wanted + 15) / 16 * 16);
}

// Large products are split across our OpenMP threads, each calling single-threaded OpenBLAS on
// pieces of C. One thread pool then does all the work: with OpenBLAS's own pool as well, the
// idle OpenMP workers spin while OpenBLAS computes (and vice versa), which costs up to a core.
// The pieces depend only on the shape and thread count, so results are deterministic for a fixed
// count, whichever thread computes a piece.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || static_cast<double>(m) * n * k < (1 << 18)) {  // OpenBLAS too runs these on one thread
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  BlasSingleThread one;
  const bool split_rows = m >= n;  // slice C along its longer side
  const int64_t len = split_rows ? m : n;
  const int64_t per = piece_width(len, threads), pieces = (len + per - 1) / per;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t lo = p * per, hi = std::min(len, lo + per);
    if (split_rows)  // rows lo..hi of C need rows lo..hi of op(A)
      sgemm(trans_a, trans_b, hi - lo, n, k, alpha, trans_a ? a + lo : a + lo * lda, lda, b, ldb, beta,
            c + lo * ldc, ldc);
    else  // columns lo..hi of C need columns lo..hi of op(B)
      sgemm(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, trans_b ? b + lo * ldb : b + lo, ldb, beta, c + lo,
            ldc);
  }
}

void gemv(int64_t n, int64_t k, float alpha, const float* w, int64_t ldw, const float* x, float beta, float* y) {
  if (n == 0) return;
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(n), static_cast<blasint>(k), alpha, w,
              static_cast<blasint>(ldw), x, 1, beta, y, 1);
}

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }
int blas_threads() { return openblas_get_num_threads(); }

BlasSingleThread::BlasSingleThread() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
BlasSingleThread::~BlasSingleThread() { openblas_set_num_threads(saved_); }

}  // namespace pf
