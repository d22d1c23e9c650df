// A caching CPU allocator for torch (gnn_dist.rss.use_workspace): the blocks of one epoch serve the next.
//
// A rank's large tensors (activations, halo rows, gradients) have the same sizes every epoch. Served by
// malloc, they either stay on the heap (which then grows to hold the largest mix ever alive, plus
// fragmentation) or, each mapped on its own, come back as fresh zero-filled pages every epoch (page faults and
// zeroing on every allocation). This allocator keeps freed blocks of 1 MiB or more mapped and hands each back
// to the next request of its size, as PyTorch's CUDA caching allocator does, so the steady state maps nothing
// new. A request no cached block matches exactly takes the nearest cached block and resizes it with mremap:
// shrinking gives the tail's pages back to the OS, growing faults in only the difference. Every byte the
// allocator holds is therefore a byte some tensor asked for, and it never holds more than the largest total
// ever alive at once: before a block grows or a new one is mapped, cached blocks are unmapped, oldest first,
// until cached + alive fit under that high-water mark. The process's peak RSS is what it is when every freed
// block is unmapped at once (what malloc with one mapping per large block gives).
// Smaller requests go to torch's default allocator (malloc's heap).
#include <torch/extension.h>

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <list>
#include <map>
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
  WorkspaceAllocator(size_t threshold, double slack, size_t huge_from)
      : threshold_(threshold), slack_(slack), huge_from_(huge_from) {}

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
    return {{"maps", maps_}, {"huge_advised", huge_advised_}, {"reuses", reuses_}, {"resizes", resizes_}, {"unmaps", unmaps_}, {"alive_bytes", (int64_t)alive_},
            {"cached_bytes", (int64_t)cached_bytes_}, {"high_water_bytes", (int64_t)high_water_},
            {"threshold_bytes", (int64_t)threshold_}};
  }

  static WorkspaceAllocator* instance;

 private:
  static constexpr size_t kPage = 4096;

  void* take(size_t size) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto exact = by_size_.find(size);
    if (exact != by_size_.end()) {
      ++reuses_;
      return hand_out(unlink(exact), size);
    }
    // With a slack, and room under the mark for a block of its own: map one rather than resize a cached block
    // of another size, which that size's next request would then miss in turn (the same sizes recur every
    // epoch, so once each has its own blocks the steady state faults nothing in). Without a slack, resizing
    // keeps what is cached smaller between peaks: mapping there raised GAT's peak RSS on sbm60k by 2.8%.
    if (slack_ > 0 && alive_ + cached_bytes_ + size <= mark(size)) return map_new(size);
    // The nearest cached block: the smallest at least this size (shrunk, no page faults), else the largest
    // below it (grown: only the difference faults in).
    auto nearest = by_size_.lower_bound(size);
    if (nearest == by_size_.end() && !by_size_.empty()) nearest = std::prev(by_size_.end());
    if (nearest != by_size_.end()) {
      const Block block = unlink(nearest);
      make_room(size);  // the block has left the cache: what must fit is alive + cached + its new size
      void* ptr = mremap(block.ptr, block.size, size, MREMAP_MAYMOVE);
      if (ptr != MAP_FAILED) {
        ++resizes_;
        advise_huge(ptr, size);  // a block grown past the threshold (mremap keeps the advice of one already above)
        return hand_out(ptr, size);
      }
      munmap(block.ptr, block.size);  // cannot resize (address space): a fresh mapping instead
      ++unmaps_;
    }
    make_room(size);
    return map_new(size);
  }

  void* map_new(size_t size) {  // with the lock held
    void* ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) {
      while (!cached_.empty()) evict_oldest();  // the address space or the memory is short: give it all back
      ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(ptr != MAP_FAILED, "gnn-dist workspace: cannot map ", size, " bytes");
    }
    // Transparent huge pages where the kernel grants them (THP "madvise" or "always"), as torch's own CPU
    // allocator does under THP_MEM_ALLOC_ENABLE: a block's first touch then faults once per 2 MiB instead of
    // once per 4 KiB, and the SpMM's gathers of neighbour rows miss the TLB less. A block holds one tensor,
    // which its kernels write whole, so about as much is resident as with small pages (sbm60k GCN: peak RSS
    // per rank unchanged). mremap keeps the advice when it resizes a block.
    advise_huge(ptr, size);
    ++maps_;
    return hand_out(ptr, size);
  }

  void advise_huge(void* ptr, size_t size) {  // with the lock held
    if (huge_from_ != 0 && size >= huge_from_ && madvise(ptr, size, MADV_HUGEPAGE) == 0) ++huge_advised_;
  }

  // Takes the most recently freed block of a size out of the cache (with the lock held).
  Block unlink(std::map<size_t, std::vector<std::list<Block>::iterator>>::iterator same_size) {
    auto it = same_size->second.back();
    same_size->second.pop_back();
    const Block block = *it;
    if (same_size->second.empty()) by_size_.erase(same_size);  // the map holds only sizes with cached blocks
    cached_.erase(it);
    cached_bytes_ -= block.size;
    return block;
  }

  // Unmaps cached blocks, oldest first, until `extra` more bytes fit under the high-water mark (or under the
  // total alive with them, when that is higher: a new high-water mark).
  void make_room(size_t extra) {
    const size_t limit = mark(extra);
    while (!cached_.empty() && alive_ + cached_bytes_ + extra > limit) evict_oldest();
  }

  // What alive + cached may reach once `extra` more is alive: the high-water mark (or the total alive with
  // `extra`, when that is higher), times 1 + slack.
  size_t mark(size_t extra) const {
    return static_cast<size_t>(static_cast<double>(std::max(high_water_, alive_ + extra)) * (1.0 + slack_));
  }

  void* hand_out(const Block& block, size_t size) { return hand_out(block.ptr, size); }
  void* hand_out(void* ptr, size_t size) {
    alive_ += size;
    high_water_ = std::max(high_water_, alive_);
    sizes_[ptr] = size;
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
    auto same = by_size_.find(block.size);
    for (auto it = same->second.begin(); it != same->second.end(); ++it) {
      if ((*it)->ptr == block.ptr) {
        same->second.erase(it);
        break;
      }
    }
    if (same->second.empty()) by_size_.erase(same);
    cached_.pop_back();
    cached_bytes_ -= block.size;
    munmap(block.ptr, block.size);
    ++unmaps_;
  }

  static void release_block(void* ptr) { instance->give_back(ptr); }

  const size_t threshold_;
  const double slack_;
  const size_t huge_from_;  // blocks of at least this many bytes are advised to use huge pages; 0: none
  std::mutex mutex_;
  std::list<Block> cached_;  // most recently freed first
  std::map<size_t, std::vector<std::list<Block>::iterator>> by_size_;  // cached blocks by size, ordered
  std::unordered_map<void*, size_t> sizes_;  // blocks alive
  size_t alive_ = 0, cached_bytes_ = 0, high_water_ = 0;
  int64_t maps_ = 0, huge_advised_ = 0, reuses_ = 0, resizes_ = 0, unmaps_ = 0;
};

WorkspaceAllocator* WorkspaceAllocator::instance = nullptr;

}  // namespace

// Makes the workspace torch's CPU allocator from now on (tensors allocated before keep their own deleters).
// Idempotent. The allocator is never destroyed: tensors may be freed during interpreter shutdown.
void install_workspace_allocator(int64_t threshold_bytes, double slack, int64_t huge_pages_from_bytes) {
  if (WorkspaceAllocator::instance == nullptr) {
    WorkspaceAllocator::instance = new WorkspaceAllocator(static_cast<size_t>(threshold_bytes), slack,
                                                          static_cast<size_t>(huge_pages_from_bytes));
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
