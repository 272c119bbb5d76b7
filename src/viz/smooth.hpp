#pragma once
// Smoothing of loss curves as the PipeFisher paper's Figure 7: a Butterworth low-pass filter
// (third order, cutoff 0.05 of the Nyquist frequency) applied forward and backward, so the
// smoothed curve has no phase lag (a plain moving average would trail the raw loss by half its
// window and shift every crossing point later).
//
//   butterworth_lowpass  scipy.signal.butter(order, cutoff): the analog Butterworth prototype's
//                        poles, pre-warped and mapped by the bilinear transform; b and a with
//                        a[0] = 1 and unit gain at DC
//   filtfilt             scipy.signal.filtfilt(b, a, x) with its defaults: x extended at both ends
//                        by odd reflection (3 * max(len(a), len(b)) samples, fewer for short
//                        series), the filter run forward and backward from steady-state initial
//                        conditions (scipy's lfilter_zi times the first sample), the extension
//                        dropped. Its gain is |H|^2 at every frequency, with zero phase.
#include <span>
#include <vector>

namespace pf {

struct IirFilter {
  std::vector<double> b, a;  // numerator, denominator (a[0] = 1)
};

// cutoff: a fraction of the Nyquist frequency, in (0, 1); order >= 1.
IirFilter butterworth_lowpass(int order, double cutoff);
// The paper's filter: butterworth_lowpass(3, 0.05).
IirFilter paper_loss_filter();
// Direct form II transposed with initial state zi (size a.size() - 1; empty = zeros).
std::vector<double> lfilter(const IirFilter& f, std::span<const double> x, std::span<const double> zi = {});
// Forward-backward filtering; a series of fewer than 2 samples is returned as it is. pad: the
// samples of odd extension at each end (0: scipy's 3 * max(len(a), len(b))), at most len - 1.
std::vector<double> filtfilt(const IirFilter& f, std::span<const double> x, size_t pad = 0);

// Loss curves of any length. The paper's filter remembers a few dozen steps, so on a short run it
// cannot leave its starting level within the series (a 5-step run's smoothed line sat flat above
// every raw point). A run of fewer than kPaperFilterMinSteps steps is smoothed with the cutoff
// raised in proportion (4 / n of the Nyquist frequency: the same number of cycles over the run)
// and the whole series as extension, which holds the ends on the raw curve; at 4 or fewer steps
// (cutoff >= 1) it is left as it is.
inline constexpr size_t kPaperFilterMinSteps = 80;
double loss_filter_cutoff(size_t steps);  // 0.05 from kPaperFilterMinSteps steps on
std::vector<double> smooth_loss(std::span<const double> x);

}  // namespace pf
