#include "schedule/lower.hpp"

#include <set>

namespace pf {

Schedule lower_communication(const Schedule& s, LowerOptions opt) {
  Schedule out = s;
  for (int d = 0; d < s.devices; ++d) {
    auto& o = out.per_device[d];
    o.clear();
    auto remote = [&](int p, int st) { return st >= 0 && st < s.stages && s.device_of(p, st) != d; };
    for (const Action& a : s.per_device[d]) {
      const int p = a.pipeline, st = a.stage, m = a.micro_batch;
      const bool fwd = a.kind == Kind::F, bwd = a.kind == Kind::B || a.kind == Kind::I;
      if (fwd && remote(p, st - 1)) o.push_back(act(Kind::RECV_F, st, m, p));
      if (bwd && remote(p, st + 1)) o.push_back(act(Kind::RECV_B, st, m, p));
      o.push_back(a);
      if (fwd && remote(p, st + 1)) o.push_back(act(Kind::SEND_F, st, m, p));
      if (bwd && remote(p, st - 1)) o.push_back(act(Kind::SEND_B, st, m, p));
    }
  }
  append_step_end(out, opt);
  return out;
}

void append_step_end(Schedule& s, LowerOptions opt) {
  for (auto& list : s.per_device) {
    std::set<std::pair<int, int>> hosted;  // (stage, pipeline), ordered by stage
    for (const Action& a : list)
      if (is_pass(a.kind))
        hosted.insert({a.stage, a.pipeline});
    for (auto [st, p] : hosted) {
      if (opt.grad_sync) list.push_back(act(Kind::ALLREDUCE, st, -1, p));
      if (opt.optimizer) list.push_back(act(Kind::OPT, st, -1, p));
    }
  }
}

}  // namespace pf
