// SIGTERM and SIGINT request a clean shutdown: the handler only sets a flag, which the trainer
// checks between steps (finish the step, checkpoint, exit). A second signal of the same kind
// while the first is pending falls back to the default action, so a stuck job can still be killed.
#pragma once

namespace loom::signals {

void install_shutdown_handlers();
bool shutdown_requested();
// The signal number that asked for shutdown, 0 if none.
int shutdown_signal();
// Clears the flag (tests, and a trainer that handled the request).
void clear_shutdown_request();

}  // namespace loom::signals
