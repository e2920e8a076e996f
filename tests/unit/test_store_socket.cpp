// The rendezvous store listens on MASTER_ADDR's interface only: loopback for one node. A port
// something already listens on is one clear error, from the launcher's check and from the bind.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loom/core/check.h"
#include "loom/distributed/store_socket.h"
#include "support/process.h"

using loom::distributed::bind_store_socket;
using loom::distributed::check_store_port_free;
using loom::distributed::is_loopback_host;

TEST(StoreSocket, LoopbackNamesAreRecognized) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.1.2.3"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("node7"));
}

TEST(StoreSocket, SingleNodeStoreBindsLoopbackOnly) {
  const int port = loom::testing::free_port();
  auto fd = bind_store_socket("127.0.0.1", port);
  ASSERT_TRUE(fd.has_value());
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  EXPECT_STREQ(text, "127.0.0.1");  // not 0.0.0.0: other machines cannot reach it
  EXPECT_EQ(ntohs(addr.sin_port), port);
  ::close(*fd);
}

TEST(StoreSocket, AnAddressOfAnotherMachineFallsBackWithAWarning) {
  // TEST-NET-1 (RFC 5737) is never an address of this machine.
  EXPECT_FALSE(bind_store_socket("192.0.2.1", loom::testing::free_port()).has_value());
}

TEST(StoreSocket, APortInUseIsOneLineNamingThePortAndTheFlags) {
  const int port = loom::testing::free_port();
  EXPECT_NO_THROW(check_store_port_free("127.0.0.1", port));
  auto held = bind_store_socket("127.0.0.1", port);  // another job's store
  ASSERT_TRUE(held.has_value());
  for (bool launcher : {true, false}) {
    try {
      if (launcher) {
        check_store_port_free("127.0.0.1", port);
      } else {
        bind_store_socket("127.0.0.1", port);
      }
      ADD_FAILURE() << "a port in use was accepted (launcher check: " << launcher << ")";
    } catch (const loom::InputError& e) {
      const std::string message = e.message();
      EXPECT_NE(message.find("port " + std::to_string(port) + " on 127.0.0.1 is already in use"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("--standalone"), std::string::npos) << message;
      EXPECT_NE(message.find("--master-port"), std::string::npos) << message;
    }
  }
  ::close(*held);
  EXPECT_NO_THROW(check_store_port_free("127.0.0.1", port));  // free again once it is closed
}
