// SIGTERM and SIGINT request a clean shutdown: the handler only sets a flag, which the trainer
// checks between steps (finish the step, checkpoint, exit). A second SIGINT while the first is
// pending falls back to the default action (Ctrl-C twice kills a stuck job); a SIGTERM after
// any pending request is ignored, since schedulers and launchers both forward one (the forced
// stop is the scheduler's SIGKILL).
#pragma once

namespace loom::signals {

void install_shutdown_handlers();
bool shutdown_requested();
// The signal number that asked for shutdown, 0 if none.
int shutdown_signal();
// Clears the flag (tests, and a trainer that handled the request).
void clear_shutdown_request();

}  // namespace loom::signals
