#include "comm/collectives.hpp"

#include "core/error.hpp"
#include "core/triangle.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>

namespace pf::comm {

BucketedAllReduce::BucketedAllReduce(MPI_Comm comm, std::vector<std::span<float>> buffers,
                                     size_t bucket_bytes)
    : comm_(comm), buffers_(std::move(buffers)) {
  const size_t per_bucket = std::max<size_t>(1, std::min<size_t>(bucket_bytes / sizeof(float), INT_MAX));
  buckets_of_buffer_.resize(buffers_.size());
  // Cut the concatenation of the buffers every per_bucket elements.
  size_t fill = per_bucket;  // elements already in the current bucket (full: start a new one)
  for (size_t i = 0; i < buffers_.size(); ++i) {
    size_t off = 0, n = buffers_[i].size();
    while (off < n) {
      if (fill == per_bucket) {
        buckets_.emplace_back();
        fill = 0;
      }
      size_t take = std::min(n - off, per_bucket - fill);
      buckets_.back().pieces.push_back({i, off, take});
      buckets_.back().count += take;
      buckets_of_buffer_[i].push_back(buckets_.size() - 1);
      fill += take;
      off += take;
    }
  }
  size_t staged = 0;
  for (const Bucket& b : buckets_)
    if (b.pieces.size() > 1) staged += b.count;
  staging_.resize(staged);
  staged = 0;
  for (Bucket& b : buckets_) {
    if (b.pieces.size() > 1) {
      b.data = staging_.data() + staged;
      staged += b.count;
    } else {
      b.data = buffers_[b.pieces[0].buffer].data() + b.pieces[0].offset;
    }
  }
  reqs_.assign(buckets_.size(), MPI_REQUEST_NULL);
  buffer_ready_.assign(buffers_.size(), false);
  for (Bucket& b : buckets_) b.pending = b.pieces.size();
}

BucketedAllReduce::~BucketedAllReduce() {
  if (std::uncaught_exceptions() == 0)
    wait_all(reqs_, WaitSite{"a gradient all-reduce", comm_, -1});
}

size_t BucketedAllReduce::fused_buckets() const {
  return std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.pieces.size() > 1; });
}

void BucketedAllReduce::post(Bucket& b, size_t index) {
  if (b.pieces.size() > 1) {
    float* dst = b.data;
    for (const Piece& p : b.pieces) {
      std::memcpy(dst, buffers_[p.buffer].data() + p.offset, p.count * sizeof(float));
      dst += p.count;
    }
  }
  check(MPI_Iallreduce(MPI_IN_PLACE, b.data, static_cast<int>(b.count), MPI_FLOAT, MPI_SUM, comm_,
                       &reqs_[index]),
        "MPI_Iallreduce");
}

void BucketedAllReduce::post_ready_buckets() {
  while (next_post_ < buckets_.size() && buckets_[next_post_].pending == 0) {
    post(buckets_[next_post_], next_post_);
    ++next_post_;
  }
}

void BucketedAllReduce::ready(size_t i) {
  PF_CHECK(i < buffers_.size() && !buffer_ready_[i], "buffer {} of {} marked ready twice or out of range",
           i, buffers_.size());
  buffer_ready_[i] = true;
  for (size_t k : buckets_of_buffer_[i]) --buckets_[k].pending;
  post_ready_buckets();
}

void BucketedAllReduce::start() {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (!buffer_ready_[i]) ready(i);
}

void BucketedAllReduce::progress() {
  if (next_post_ == 0) return;
  int flag = 0;
  check(MPI_Testall(static_cast<int>(next_post_), reqs_.data(), &flag, MPI_STATUSES_IGNORE),
        "MPI_Testall(all-reduce)");
}

bool BucketedAllReduce::test() {
  if (next_post_ < buckets_.size()) return false;
  int flag = 0;
  check(MPI_Testall(static_cast<int>(next_post_), reqs_.data(), &flag, MPI_STATUSES_IGNORE),
        "MPI_Testall(all-reduce)");
  return flag != 0;
}

void BucketedAllReduce::wait() {
  PF_CHECK(next_post_ == buckets_.size(), "wait() with {} of {} buckets not posted (buffers not ready)",
           buckets_.size() - next_post_, buckets_.size());
  wait_all(reqs_, WaitSite{"a gradient all-reduce", comm_, -1});
  for (Bucket& b : buckets_) {
    if (b.pieces.size() > 1) {
      const float* src = b.data;
      for (const Piece& p : b.pieces) {
        std::memcpy(buffers_[p.buffer].data() + p.offset, src, p.count * sizeof(float));
        src += p.count;
      }
    }
    b.pending = b.pieces.size();
  }
  // Ready for the next step.
  std::fill(buffer_ready_.begin(), buffer_ready_.end(), false);
  next_post_ = 0;
}

namespace {
size_t packed_count(const std::vector<SymMatrix>& mats) {
  size_t n = 0;
  for (const SymMatrix& m : mats) n += static_cast<size_t>(triangle_size(m.n));
  return n;
}
}  // namespace

SymmetricAllReduce::SymmetricAllReduce(MPI_Comm comm, std::vector<SymMatrix> mats, size_t bucket_bytes)
    : mats_(std::move(mats)),
      packed_(packed_count(mats_)),
      reduce_(comm, {std::span<float>(packed_)}, bucket_bytes) {}

void SymmetricAllReduce::start() {
  float* dst = packed_.data();
  for (const SymMatrix& m : mats_) dst = pack_triangle(m.data, m.n, 0, m.n, dst);
  reduce_.start();
}

void SymmetricAllReduce::wait() {
  reduce_.wait();
  const float* src = packed_.data();
  for (const SymMatrix& m : mats_) src = unpack_triangle(src, m.data, m.n, 0, m.n, true);
}

void broadcast_bytes(void* data, size_t bytes, int root, MPI_Comm comm) {
  auto* p = static_cast<char*>(data);
  // MPI counts are int: send huge buffers in pieces.
  while (bytes > 0) {
    int n = static_cast<int>(std::min<size_t>(bytes, INT_MAX));
    MPI_Request req;
    check(MPI_Ibcast(p, n, MPI_BYTE, root, comm, &req), "MPI_Ibcast");
    wait(req, WaitSite{"a broadcast", comm, root});
    p += n;
    bytes -= n;
  }
}

void broadcast(std::span<float> buf, int root, MPI_Comm comm) {
  broadcast_bytes(buf.data(), buf.size_bytes(), root, comm);
}

}  // namespace pf::comm
