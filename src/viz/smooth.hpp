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
// Forward-backward filtering; a series of fewer than 2 samples is returned as it is.
std::vector<double> filtfilt(const IirFilter& f, std::span<const double> x);

}  // namespace pf
