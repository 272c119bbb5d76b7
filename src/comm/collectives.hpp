#pragma once
// Collectives: bucketed gradient all-reduce, broadcast, packed symmetric all-reduce.
//
// Bucketing (as PyTorch DDP): the buffers are viewed as one concatenation, cut into buckets of
// bucket_bytes (25 MB default); each bucket is one MPI_Iallreduce(SUM), so small buffers travel
// fused and a large one is split, a bucket boundary possibly falling inside a buffer. A bucket
// inside one buffer is reduced in place; a bucket spanning several is packed into a staging
// buffer allocated once with the plan (the plan is made once per set of gradient buffers and
// reused every step).
//
// Overlap: ready(i) says buffer i is final (backward produced it); each bucket is posted as soon
// as all its buffers are ready, always in bucket order (non-blocking collectives must be posted
// in the same order on every rank, and the buffer list is the same on every rank). progress()
// lets MPI advance posted buckets between compute actions; wait() finishes them all.
//
// Determinism: element i of the result is the sum of the ranks' element i computed by one
// reduction tree; every algorithm OpenMPI's libnbc uses for MPI_Iallreduce (ring, binomial,
// recursive halving) leaves all ranks with the same bits, and for a fixed np and bucket size the
// choice is fixed. No algorithm is forced (tests/comm checks the bits agree across ranks).
#include "comm/wait.hpp"

#include <cstddef>
#include <span>
#include <vector>

namespace pf::comm {

inline constexpr size_t kDefaultBucketBytes = 25u << 20;

class BucketedAllReduce {
 public:
  BucketedAllReduce(MPI_Comm comm, std::vector<std::span<float>> buffers,
                    size_t bucket_bytes = kDefaultBucketBytes);
  ~BucketedAllReduce();
  BucketedAllReduce(const BucketedAllReduce&) = delete;
  BucketedAllReduce& operator=(const BucketedAllReduce&) = delete;

  void start();            // every buffer is ready: post all buckets
  void ready(size_t i);    // buffer i is final; posts the buckets that became complete
  void progress();         // lets MPI advance posted buckets (call between compute actions)
  bool test();             // every bucket posted and summed (wait() then only unpacks)
  void wait();             // waits for every bucket (all buffers must be ready) and unpacks
  size_t buckets() const { return buckets_.size(); }
  size_t fused_buckets() const;  // buckets that go through the staging buffer

 private:
  struct Piece {
    size_t buffer, offset, count;
  };
  struct Bucket {
    std::vector<Piece> pieces;
    float* data = nullptr;  // in-place slice, or staging memory
    size_t count = 0;
    size_t pending = 0;     // pieces whose buffer is not ready yet
  };
  void post(Bucket& b, size_t index);
  void post_ready_buckets();

  MPI_Comm comm_;
  std::vector<std::span<float>> buffers_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_buffer_;
  std::vector<float> staging_;
  std::vector<MPI_Request> reqs_;  // one per bucket
  std::vector<bool> buffer_ready_;
  size_t next_post_ = 0;            // buckets are posted in order
};

// Sum of symmetric matrices (K-FAC factors) across comm, sending only the upper triangles:
// start() packs each matrix's upper triangle (row-major, j >= i; the lower is ignored) into one
// buffer and posts a bucketed all-reduce of it; wait() unpacks the sums into both triangles.
struct SymMatrix {
  float* data;  // n x n, row-major
  int n;
};
class SymmetricAllReduce {
 public:
  SymmetricAllReduce(MPI_Comm comm, std::vector<SymMatrix> mats,
                     size_t bucket_bytes = kDefaultBucketBytes);
  void start();
  void wait();
  size_t packed_size() const { return packed_.size(); }

 private:
  std::vector<SymMatrix> mats_;
  std::vector<float> packed_;
  BucketedAllReduce reduce_;
};

// Broadcast from `root` of comm (non-blocking underneath, waited for without spinning).
void broadcast(std::span<float> buf, int root, MPI_Comm comm);
void broadcast_bytes(void* data, size_t bytes, int root, MPI_Comm comm);

}  // namespace pf::comm
