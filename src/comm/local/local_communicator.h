// A world of one process without MPI (a script run without mpirun).  Every
// collective is a copy (or nothing); send/recv to self go through a mailbox.
#pragma once

#include <map>
#include <mutex>
#include <vector>

#include "comm/layered_host.h"
#include "tutti/comm.h"

namespace tutti {
namespace comm {

class LocalCommunicator : public Communicator, public LayeredHost {
 public:
  explicit LocalCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  std::string name() const override { return name_; }
  WorkPtr submit(const OpRequest& request, bool blocking) override;
  WorkPtr submit_layered(const OpRequest& request, bool blocking,
                         Check also_validate) override;
  std::shared_ptr<Communicator> split(int color, int key,
                                      const std::string& name) override;

 private:
  std::string name_;
  std::mutex mu_;
  uint64_t next_seq_ = 0;
  std::map<int, std::vector<std::vector<char>>> mailbox_;  // by tag
};

}  // namespace comm
}  // namespace tutti
