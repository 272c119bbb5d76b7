#pragma once
// Stop signals a command answers by finishing cleanly (train: a checkpoint; generate: the text so
// far) rather than dying mid-write.
#include <initializer_list>

namespace pf {

// `handler` runs for each of `signals`. A second signal of a kind takes the default action (the
// impatient user wins), and a system call it interrupts restarts rather than failing with EINTR
// (a checkpoint being written).
void catch_stop_signals(void (*handler)(int), std::initializer_list<int> signals);

}  // namespace pf
