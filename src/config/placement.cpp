// What each kfac.placement is (placement.hpp): the one switch over the setting.
#include "config/placement.hpp"

#include <fmt/format.h>

namespace pf {

PlacementSpec placement_spec(const KfacConfig& k) {
  switch (k.placement) {
    case Placement::Bubbles:
      return {.planned = true, .curvature_every = k.inverse_every, .where = "in the pipeline bubbles: PipeFisher"};
    case Placement::Adaptive:
      return {.planned = true, .fills_waits = true, .curvature_every = k.inverse_every,
              .where = "in the pipeline bubbles, placed at run time: PipeFisher adaptive"};
    case Placement::Replay:
      return {.replays = true, .curvature_every = k.inverse_every, .where = "replay: the refresh pattern of " + k.refresh_record};
    case Placement::Skip:
      return {.inline_refresh = true, .curvature_every = k.inverse_every, .statistics_at_refreshes_only = true,
              .where = fmt::format("skip: refreshed every {} steps", k.inverse_every)};
    case Placement::Inline:
      break;
  }
  return {.inline_refresh = true, .curvature_every = 1, .where = "inline"};
}

}  // namespace pf
