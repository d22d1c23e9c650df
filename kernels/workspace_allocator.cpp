// A caching CPU allocator for torch (gnn_dist.rss.use_workspace): the blocks of one epoch serve the next.
//
// A rank's large tensors (activations, halo rows, gradients) have the same sizes every epoch. Served by
// malloc, they either stay on the heap (which then grows to hold the largest mix ever alive, plus
// fragmentation) or, each mapped on its own, come back as fresh zero-filled pages every epoch (page faults and
// zeroing on every allocation). This allocator keeps freed blocks of 1 MiB or more mapped and hands each back
// to the next request of exactly its size, as PyTorch's CUDA caching allocator does, so the steady state maps
// nothing new. It never holds more than the largest total ever alive at once: before mapping a new block it
// unmaps cached blocks, oldest first, until cached + alive + the new block fit under that high-water mark. The
// process's peak RSS is therefore what it is when every freed block is unmapped at once.
// Smaller requests go to torch's default allocator (malloc's heap).
#include <torch/extension.h>

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

struct Block {
  void* ptr;
  size_t size;
};

class WorkspaceAllocator final : public c10::Allocator {
 public:
  WorkspaceAllocator(size_t threshold, double slack) : threshold_(threshold), slack_(slack) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < threshold_) {
      return c10::GetDefaultCPUAllocator()->allocate(n);
    }
    const size_t size = (n + kPage - 1) / kPage * kPage;
    void* ptr = take(size);
    return {ptr, ptr, &WorkspaceAllocator::release_block, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Unmaps every cached block (the heap's malloc_trim counterpart), keeping the high-water mark.
  void release_cached() {
    std::lock_guard<std::mutex> guard(mutex_);
    while (!cached_.empty()) evict_oldest();
  }

  std::unordered_map<std::string, int64_t> stats() {
    std::lock_guard<std::mutex> guard(mutex_);
    return {{"maps", maps_}, {"reuses", reuses_}, {"unmaps", unmaps_}, {"alive_bytes", (int64_t)alive_},
            {"cached_bytes", (int64_t)cached_bytes_}, {"high_water_bytes", (int64_t)high_water_},
            {"threshold_bytes", (int64_t)threshold_}};
  }

  static WorkspaceAllocator* instance;

 private:
  static constexpr size_t kPage = 4096;

  void* take(size_t size) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto found = by_size_.find(size);
    if (found != by_size_.end() && !found->second.empty()) {
      auto it = found->second.back();  // the most recently freed block of this size
      found->second.pop_back();
      void* ptr = it->ptr;
      cached_.erase(it);
      cached_bytes_ -= size;
      alive_ += size;
      sizes_[ptr] = size;
      ++reuses_;
      return ptr;
    }
    // No block of exactly this size: a larger cached one serves it when that keeps the total alive under the
    // high-water mark (its spare pages were counted there before), the smallest such, at most twice the size.
    if (alive_ + size <= high_water_) {
      auto best = by_size_.end();
      for (auto it = by_size_.begin(); it != by_size_.end(); ++it) {
        if (!it->second.empty() && it->first > size && it->first <= 2 * size && alive_ + it->first <= high_water_ &&
            (best == by_size_.end() || it->first < best->first))
          best = it;
      }
      if (best != by_size_.end()) {
        auto it = best->second.back();
        best->second.pop_back();
        void* ptr = it->ptr;
        const size_t block = it->size;
        cached_.erase(it);
        cached_bytes_ -= block;
        alive_ += block;
        sizes_[ptr] = block;
        ++reuses_;
        return ptr;
      }
    }
    const size_t mark = static_cast<size_t>(static_cast<double>(std::max(high_water_, alive_ + size)) * (1.0 + slack_));
    while (!cached_.empty() && alive_ + cached_bytes_ + size > mark) evict_oldest();
    void* ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) {
      while (!cached_.empty()) evict_oldest();  // the address space or the memory is short: give it all back
      ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(ptr != MAP_FAILED, "gnn-dist workspace: cannot map ", size, " bytes");
    }
    alive_ += size;
    high_water_ = std::max(high_water_, alive_);
    sizes_[ptr] = size;
    ++maps_;
    return ptr;
  }

  void give_back(void* ptr) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto found = sizes_.find(ptr);
    TORCH_CHECK(found != sizes_.end(), "gnn-dist workspace: freeing a block it did not allocate");
    const size_t size = found->second;
    sizes_.erase(found);
    alive_ -= size;
    cached_.push_front({ptr, size});
    by_size_[size].push_back(cached_.begin());
    cached_bytes_ += size;
  }

  void evict_oldest() {  // with the lock held
    const Block block = cached_.back();
    auto& same = by_size_[block.size];
    for (auto it = same.begin(); it != same.end(); ++it) {
      if ((*it)->ptr == block.ptr) {
        same.erase(it);
        break;
      }
    }
    cached_.pop_back();
    cached_bytes_ -= block.size;
    munmap(block.ptr, block.size);
    ++unmaps_;
  }

  static void release_block(void* ptr) { instance->give_back(ptr); }

  const size_t threshold_;
  const double slack_;
  std::mutex mutex_;
  std::list<Block> cached_;  // most recently freed first
  std::unordered_map<size_t, std::vector<std::list<Block>::iterator>> by_size_;
  std::unordered_map<void*, size_t> sizes_;  // blocks alive
  size_t alive_ = 0, cached_bytes_ = 0, high_water_ = 0;
  int64_t maps_ = 0, reuses_ = 0, unmaps_ = 0;
};

WorkspaceAllocator* WorkspaceAllocator::instance = nullptr;

}  // namespace

// Makes the workspace torch's CPU allocator from now on (tensors allocated before keep their own deleters).
// Idempotent. The allocator is never destroyed: tensors may be freed during interpreter shutdown.
void install_workspace_allocator(int64_t threshold_bytes, double slack) {
  if (WorkspaceAllocator::instance == nullptr) {
    WorkspaceAllocator::instance = new WorkspaceAllocator(static_cast<size_t>(threshold_bytes), slack);
    c10::SetCPUAllocator(WorkspaceAllocator::instance, /*priority=*/1);
  }
}

std::unordered_map<std::string, int64_t> workspace_stats() {
  if (WorkspaceAllocator::instance == nullptr) return {};
  return WorkspaceAllocator::instance->stats();
}

void release_workspace() {
  if (WorkspaceAllocator::instance != nullptr) WorkspaceAllocator::instance->release_cached();
}
