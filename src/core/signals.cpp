#include "core/signals.hpp"

#include <csignal>

namespace pf {

void catch_stop_signals(void (*handler)(int), std::initializer_list<int> signals) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int sig : signals) sigaction(sig, &sa, nullptr);
}

}  // namespace pf
