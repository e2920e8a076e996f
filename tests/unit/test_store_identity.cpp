// A rank never joins another job's rendezvous store: the owner writes its run id and world size,
// a client checks them before writing anything, every rank claims its rank once per attempt.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "comm_test_util.h"
#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/store_identity.h"
#include "loom/distributed/store_socket.h"
#include "loom/launch/elastic_rendezvous.h"
#include "support/process.h"

namespace loom {
namespace {

using distributed::CommError;
using distributed::ProcessGroups;
using distributed::StoreIdentity;
using namespace std::chrono_literals;

using loom::testing::contains;

// The store a job's rank 0 owns, on a fresh loopback port.
struct OwnedStore {
  int port = testing::free_port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  c10::intrusive_ptr<c10d::TCPStore> store;

  explicit OwnedStore(const StoreIdentity* identity) {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = 10s;
    options.masterListenFd = distributed::bind_store_socket("127.0.0.1", port);
    store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    if (identity) distributed::write_store_identity(*store, *identity);
  }

  c10::intrusive_ptr<c10d::TCPStore> client() const {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.waitWorkers = false;
    options.timeout = 10s;
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  }
};

const std::string kAdvice = distributed::busy_port_advice();

// The InputError message of `check`, failing the test when it does not throw one.
template <typename F>
std::string input_error_of(F check) {
  try {
    check();
  } catch (const InputError& e) {
    return e.message();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

TEST(StoreIdentity, AClientOfAnotherRunIsRefusedNamingBothBeforeItWritesAnything) {
  const StoreIdentity abc{"abc", 2};
  OwnedStore owned(&abc);
  auto client = owned.client();
  const int64_t keys_before = owned.store->getNumKeys();
  const std::string message = input_error_of([&] {
    distributed::check_store_identity(*client, {"xyz", 2}, owned.address, 5s, kAdvice);
  });
  EXPECT_TRUE(contains(message, "the rendezvous store at " + owned.address +
                                    " belongs to run 'abc' (this job is run 'xyz')"))
      << message;
  EXPECT_TRUE(contains(message, "--standalone")) << message;
  EXPECT_TRUE(contains(message, "--master-port")) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(owned.store->getNumKeys(), keys_before);  // the other job's store is untouched
}

TEST(StoreIdentity, TheSameRunPassesAndAnotherWorldSizeIsRefused) {
  const StoreIdentity abc{"abc", 2};
  OwnedStore owned(&abc);
  auto client = owned.client();
  EXPECT_NO_THROW(distributed::check_store_identity(*client, abc, owned.address, 5s, kAdvice));
  const std::string message = input_error_of([&] {
    distributed::check_store_identity(*client, {"abc", 4}, owned.address, 5s, kAdvice);
  });
  EXPECT_TRUE(contains(message, "belongs to a job of 2 ranks (run 'abc'; this job has 4)"))
      << message;
}

TEST(StoreIdentity, AStoreWithoutARunIdIsNotThisJobs) {
  OwnedStore owned(nullptr);  // a c10d store some other program hosts
  auto client = owned.client();
  const auto start = std::chrono::steady_clock::now();
  const std::string message = input_error_of([&] {
    distributed::check_store_identity(*client, {"xyz", 2}, owned.address, 300ms, kAdvice);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(contains(message, "the store at " + owned.address + " holds no loom run id"))
      << message;
}

TEST(StoreIdentity, ARankIsClaimedOncePerAttempt) {
  const StoreIdentity abc{"abc", 1};
  OwnedStore owned(&abc);
  distributed::join_store(*owned.store, 0, 1, 0, "abc", owned.address, 5s, kAdvice);
  // A second rank 0 of the same run (another job started with the same --rdzv-id and port).
  const std::string message = input_error_of(
      [&] { distributed::join_store(*owned.store, 0, 1, 0, "abc", owned.address, 5s, kAdvice); });
  EXPECT_TRUE(contains(
      message, "rank 0 already joined the rendezvous store at " + owned.address + " (run 'abc')"))
      << message;
  // A restarted group joins the same store again (torchrun's agent keeps it).
  EXPECT_NO_THROW(
      distributed::join_store(*owned.store, 0, 1, 1, "abc", owned.address, 5s, kAdvice));
}

TEST(StoreIdentity, AMissingRankTimesOutNamingTheCount) {
  const StoreIdentity abc{"abc", 3};
  OwnedStore owned(&abc);
  try {
    distributed::join_store(*owned.store, 0, 3, 0, "abc", owned.address, 300ms, kAdvice);
    ADD_FAILURE() << "join_store did not time out";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.message(), "1 of 3 ranks joined within comm.init_timeout_seconds"))
        << e.message();
  }
}

// The whole rendezvous: a rank of another run reaching a running job's store is refused at
// once, naming both runs, and the job's own collectives go on undisturbed.
TEST(StoreIdentity, ARankOfAnotherRunCannotJoinARunningJob) {
  const int port = testing::free_port();
  std::promise<void> joined0, joined1, intruder_done;
  std::shared_future<void> intruder_checked = intruder_done.get_future().share();
  std::vector<std::string> errors(2);
  auto rank_body = [&](int rank, std::promise<void>& joined) {
    try {
      auto init = testing::thread_rank_init(rank, 2, port);
      init.run_id = "abc";
      ProcessGroups groups(init);
      joined.set_value();
      intruder_checked.wait();
      at::Tensor t = at::full({2}, static_cast<float>(rank + 1));
      groups.world().all_reduce(t);
      if (!at::equal(t, at::full({2}, 3.0f))) errors[rank] = "wrong all_reduce result";
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread rank0(rank_body, 0, std::ref(joined0));
  std::thread rank1(rank_body, 1, std::ref(joined1));
  joined0.get_future().wait();
  joined1.get_future().wait();

  auto init = testing::thread_rank_init(1, 2, port);
  init.run_id = "xyz";
  const auto start = std::chrono::steady_clock::now();
  const std::string message = input_error_of([&] { ProcessGroups intruder(init); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  intruder_done.set_value();
  rank0.join();
  rank1.join();
  EXPECT_TRUE(contains(message, "belongs to run 'abc' (this job is run 'xyz')")) << message;
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// The elastic agents' store: the host's run id is the job's; an agent without --rdzv-id takes
// it, one with another --rdzv-id is refused naming both.
TEST(StoreIdentity, ElasticAgentsShareTheHostsRunIdAndRefuseAnother) {
  distributed::ElasticOptions options;
  options.endpoint_port = testing::free_port();
  options.join_timeout_s = 20;
  options.last_call_timeout_s = 0.05;
  options.keep_alive_interval_s = 0.05;
  options.run_id = "job-a";
  distributed::ElasticRendezvous host(options);

  options.run_id = "job-b";
  const std::string message =
      input_error_of([&] { distributed::ElasticRendezvous other_job(options); });
  EXPECT_TRUE(contains(message, "the elastic rendezvous store at 127.0.0.1:" +
                                    std::to_string(options.endpoint_port) +
                                    " belongs to run 'job-a' (this node has --rdzv-id 'job-b')"))
      << message;

  options.run_id = "";
  distributed::ElasticRendezvous same_job(options);
  const auto round = same_job.next_rendezvous(0);  // leads round 0 alone (min 1 node)
  EXPECT_EQ(round.run_id, "job-a");
}

}  // namespace
}  // namespace loom
