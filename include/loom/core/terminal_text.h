// Text from outside (a peer's status line, a store entry) made safe to print on a terminal:
// whoever wrote it could otherwise send escape sequences that move the cursor, retitle the
// window or rewrite what was printed before.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::terminal {

// `text` with control bytes, DEL, backslashes and bytes beyond ASCII written as \xNN, cut to
// `max_chars` input bytes ("..." marks the cut).
std::string escaped(std::string_view text, size_t max_chars = 2000);

}  // namespace loom::terminal
