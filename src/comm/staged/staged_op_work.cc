// StagedOpWork: waiting for a staged op, and completing a send/recv.
#include "comm/staged/staged_op_work.h"

#include <chrono>
#include <utility>

#include "comm/backoff.h"
#include "core/check.h"

namespace tutti {
namespace staged {

StagedOpWork::StagedOpWork(std::unique_ptr<OpCopies> copies,
                           std::function<void(const Error&)> broke)
    : comm::StagedWork("staged", "cuda (posted)"), copies_(std::move(copies)), broke_(std::move(broke)) {}

StagedOpWork::~StagedOpWork() {
  // A send/recv nobody completed: its MPI request may still read or write
  // the staging buffer.
  if (staging_ && host_) staging_->abandon();
}

void StagedOpWork::posted(WorkPtr host, std::unique_ptr<Staging> staging, void* dst,
                          size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  host_ = std::move(host);
  staging_ = std::move(staging);
  dst_ = dst;
  bytes_ = bytes;
}

bool StagedOpWork::finish_p2p(std::unique_lock<std::mutex>& lock, bool block) {
  if (error_) std::rethrow_exception(error_);
  if (!host_) return true;  // a collective, or completed already
  // The host work is waited for without mu_, so test() on another thread
  // never blocks behind a waiting receive.
  WorkPtr host = host_;
  std::exception_ptr failure;
  bool complete = false;
  lock.unlock();
  try {
    complete = block ? (host->wait(), true) : host->test();
  } catch (...) {
    failure = std::current_exception();
    complete = true;
  }
  lock.lock();
  if (error_) std::rethrow_exception(error_);
  if (!host_) return true;  // another thread completed it meanwhile
  if (!complete) return false;
  host_.reset();
  if (failure) {
    staging_->settle_after(failure);
    staging_.reset();
    error_ = failure;
    stage_ = kDone;
    cv_.notify_all();
    std::rethrow_exception(failure);
  }
  try {
    if (dst_) copies_->to_device(dst_, staging_->staging_out(), bytes_);
    copies_->finish();
  } catch (...) {
    staging_->abandon();  // the copy may still read it
    staging_.reset();
    error_ = std::current_exception();
    stage_ = kDone;
    cv_.notify_all();
    if (broke_) broke_(detail::error_of(error_));
    std::rethrow_exception(error_);
  }
  // Back to the pool: a later holder writes it only after its wait_host(),
  // which follows this copy on the same stream (copier.h).
  staging_->release();
  staging_.reset();
  return true;
}

void StagedOpWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_started(lock);
  finish_p2p(lock, true);
  copies_->stream_wait();
}

void StagedOpWork::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_started(lock);
  finish_p2p(lock, true);
  lock.unlock();
  // The copies left are this op's host-to-device ones: the caller's stream
  // reached the op before the host exchange began, so they finish.
  comm::Backoff backoff = comm::Backoff::from_settings();
  while (!copies_->done()) backoff.next_and_pause();
}

bool StagedOpWork::test() {
  std::unique_lock<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
  if (stage_ == kQueued) return false;
  if (!finish_p2p(lock, false)) return false;
  return copies_->done();
}

}  // namespace staged
}  // namespace tutti
